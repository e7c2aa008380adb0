"""The one way the demo, the robustness study and the published-config check run a ``tools/`` script.

A ``tools/*.py`` tool runs as a process of this interpreter in the repository
root, a ``tools/*.sh`` script under bash with ``PYTHON`` set to this
interpreter, its command echoed first (``$ tools/x.py ...``); with
:func:`run_tool` a tool that fails stops the caller (``SystemExit`` naming the
command), :func:`start_tool` leaves its process to the caller. ``tools/train.py`` runs in one
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


def start_tool(command: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start a tool of this repository (``env`` added to the environment) and return its process: a ``.sh``
    script under bash with ``PYTHON`` set to this interpreter, anything else with this interpreter."""
    assignments = [f'{name}={value}' for name, value in (env or {}).items()]
    print('  $ ' + ' '.join(assignments + command), flush=True)
    interpreter = ['bash'] if command[0].endswith('.sh') else [sys.executable]
    return subprocess.Popen(interpreter + command, cwd=REPO_ROOT,
                            env=dict(os.environ, PYTHON=sys.executable, **(env or {})))


def run_tool(command: List[str], env: Optional[Dict[str, str]] = None) -> None:
    """Run a tool of this repository (:func:`start_tool`) to its end; stop the demo naming the step if it fails."""
    returncode = start_tool(command, env).wait()
    if returncode != 0:
        raise SystemExit(f'demo stopped: `{" ".join(command)}` exited with code {returncode}')


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
