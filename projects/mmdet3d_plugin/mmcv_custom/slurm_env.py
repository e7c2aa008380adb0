"""A slurm job's process group: the variables ``srun`` sets, as ``torch.distributed``'s ``env://`` start reads them.

``srun`` starts one task per process and tells each where it stands:
``SLURM_PROCID`` (its global rank), ``SLURM_NTASKS`` (the world size),
``SLURM_LOCALID`` (its rank on its node) and ``SLURM_NODELIST`` (the job's
hosts, compressed, e.g. ``gpu[01-02]``). :func:`torch_env_from_slurm` turns
them into ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` with mmcv's rules for its slurm launcher: the master is the
first host of the node list (``scontrol show hostnames``) unless
``MASTER_ADDR`` is set, the port is the config's ``dist_params.port``, else
``MASTER_PORT``, else 29500. ``mmcv_custom.launch.init_distributed`` then
starts the group as for ``torch.distributed.run``: nccl on GPUs, gloo on the CPU.
"""
import subprocess
from typing import Dict, Mapping, Optional

#: ``MASTER_PORT`` when neither the config nor the environment names one (mmcv's default).
DEFAULT_PORT = 29500
#: What srun sets in every task and the translation reads.
SLURM_VARIABLES = ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID', 'SLURM_NODELIST')


def first_host(nodelist: str) -> str:
    """The first host of a slurm node list (``gpu[01-02]`` -> ``gpu01``), expanded by ``scontrol show hostnames``."""
    try:
        result = subprocess.run(['scontrol', 'show', 'hostnames', nodelist], capture_output=True, text=True,
                                check=True)
    except FileNotFoundError as error:
        raise RuntimeError('--launcher slurm reads the first host of SLURM_NODELIST with scontrol, which is not on '
                           'PATH: run the job on a slurm node or set MASTER_ADDR') from error
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f'scontrol show hostnames {nodelist!r} failed: {error.stderr.strip()}') from error
    hosts = result.stdout.split()
    if not hosts:
        raise RuntimeError(f'scontrol show hostnames {nodelist!r} printed no host')
    return hosts[0]


def torch_env_from_slurm(environ: Mapping[str, str], port: Optional[int] = None) -> Dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` of the slurm task ``environ``.

    Args:
        environ (Mapping[str, str]): the task's environment (``os.environ``).
        port (int, optional): the config's ``dist_params.port``; before ``MASTER_PORT``.

    Returns:
        dict[str, str]: the variables to set.
    """
    missing = [name for name in SLURM_VARIABLES if name not in environ]
    if missing:
        raise RuntimeError(f'--launcher slurm needs the variables srun sets in each task, missing: {", ".join(missing)}'
                           ' (start the job with srun, e.g. tools/slurm_train.sh)')
    master_port = port if port is not None else environ.get('MASTER_PORT', DEFAULT_PORT)
    return dict(RANK=environ['SLURM_PROCID'], WORLD_SIZE=environ['SLURM_NTASKS'], LOCAL_RANK=environ['SLURM_LOCALID'],
                MASTER_ADDR=environ.get('MASTER_ADDR') or first_host(environ['SLURM_NODELIST']),
                MASTER_PORT=str(master_port))
