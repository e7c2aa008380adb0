"""The one way the demo and the robustness study run a ``tools/*.py`` script.

A tool runs as a process of this interpreter in the repository root, its
command echoed first (``$ tools/x.py ...``); a tool that fails stops the
caller (``SystemExit`` naming the command). ``tools/train.py`` runs in one
process or, data-parallel, in several under ``torch.distributed.run`` with
the cores split between them (:func:`train_command`). The library never
imports ``tools/``: it names the scripts by their repository paths.
"""
import os
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

from ..utils.local_resources import free_port, usable_cores
from ..utils.repo_paths import REPO_ROOT


def run_tool(command: List[str], env: Optional[Dict[str, str]] = None) -> None:
    """Run a tool of this repository with the same interpreter (and ``env`` added to the environment); stop the
    demo naming the step if it fails."""
    assignments = [f'{name}={value}' for name, value in (env or {}).items()]
    print('  $ ' + ' '.join(assignments + command), flush=True)
    result = subprocess.run([sys.executable] + command, cwd=REPO_ROOT, env=dict(os.environ, **(env or {})))
    if result.returncode != 0:
        raise SystemExit(f'demo stopped: `{" ".join(command)}` exited with code {result.returncode}')


def training_processes(requested: Optional[int], config_processes: int, cores: int, has_gpu: bool) -> int:
    """How many data-parallel processes train.

    Args:
        requested (int, optional): ``--processes``; None takes the config's
            ``config_processes`` on a CPU machine with at least as many cores, else 1.
        config_processes (int): the config's ``demo_processes`` (1 when it sets none).
        cores (int): usable CPU cores.
        has_gpu (bool): whether CUDA is available (then one process drives the GPU).
    """
    if requested is None:
        return config_processes if not has_gpu and cores >= config_processes else 1
    if requested < 1:
        raise SystemExit(f'demo stopped: --processes must be >= 1, got {requested}')
    return requested


def train_command(arguments: List[str], processes: int, cores: int) -> Tuple[List[str], Dict[str, str]]:
    """The command and environment that run ``tools/train.py arguments`` in ``processes`` processes.

    Several processes run under ``torch.distributed.run`` with the ``pytorch``
    launcher (gloo without a GPU), each with ``cores // processes`` threads.
    """
    if processes == 1:
        return ['tools/train.py'] + arguments, {}
    launcher = ['-m', 'torch.distributed.run', '--nnodes', '1', '--nproc_per_node', str(processes),
                '--master_addr', '127.0.0.1', '--master_port', str(free_port())]
    threads = str(max(1, cores // processes))
    return launcher + ['tools/train.py', '--launcher', 'pytorch'] + arguments, dict(OMP_NUM_THREADS=threads,
                                                                                 MKL_NUM_THREADS=threads)


def run_training(arguments: List[str], requested: Optional[int], config_processes: int) -> None:
    """``tools/train.py arguments`` in :func:`training_processes` processes on this machine's cores."""
    import torch
    cores = usable_cores()
    run_tool(*train_command(arguments, training_processes(requested, config_processes, cores,
                                                          torch.cuda.is_available()), cores))
