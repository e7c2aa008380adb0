"""The peak memory a call needs beyond its inputs, on the CPU measured in a fresh process.

Used by ``tools/benchmark_attention.py`` (one attention call) and
``tools/benchmark_model.py`` (one inference or training step)::

    peak_mib = memory_in_subprocess(measure_case, case)   # measure_case(case) calls peak_rss_mib

Freed buffers stay in a process's resident set (glibc keeps them), so the
measurement runs in a fresh interpreter whose glibc mmap threshold is fixed
(``MALLOC_MMAP_THRESHOLD_``): freed buffers then leave the resident set.
After a warm-up call (the caller's), :func:`peak_rss_mib` resets the kernel's
resident-set high-water mark (``/proc/self/clear_refs``) and reports
``VmHWM - VmRSS`` around one more call: the memory the call needs beyond its
inputs (outputs and gradients included).
"""
import importlib
import json
import os
import subprocess
import sys
from typing import Any, Callable

from ..utils.repo_paths import REPO_ROOT

#: the environment of a measuring process: freed buffers of 128 KiB and more go back to the kernel at once
MEMORY_ENV = dict(MALLOC_MMAP_THRESHOLD_='131072')
#: the command that runs :func:`run_worker` in a fresh interpreter (the repository root is its working directory)
_WORKER = f'from {__name__} import run_worker; run_worker()'


def read_status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...)."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1])
    raise RuntimeError(f'{field} not in /proc/self/status')


def peak_rss_mib(call: Callable[[], Any]) -> float:
    """MiB the resident set of this process grows by at its peak during ``call()`` (Linux)."""
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # the high-water mark VmHWM := the current VmRSS
    before = read_status_kb('VmRSS')
    call()
    return (read_status_kb('VmHWM') - before) / 1024


def memory_in_subprocess(worker: Callable[[Any], Any], payload: Any) -> Any:
    """``worker(payload)`` run in a fresh interpreter with :data:`MEMORY_ENV`; its result.

    Args:
        worker (Callable): a module-level function; it takes the JSON-decoded
            ``payload`` and returns a JSON-serialisable result.
        payload: its argument, JSON-serialisable.

    Raises:
        RuntimeError: the process failed (the message ends with its stderr).
    """
    target = f'{worker.__module__}:{worker.__qualname__}'
    proc = subprocess.run([sys.executable, '-c', _WORKER, target, json.dumps(payload)], capture_output=True,
                          text=True, env=dict(os.environ, **MEMORY_ENV), cwd=REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f'the memory measurement {target} failed:\n{proc.stderr[-3000:]}')
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker() -> None:
    """The measuring process: ``argv = [module:function, JSON payload]``; prints the JSON result last."""
    module, name = sys.argv[1].split(':')
    print(json.dumps(getattr(importlib.import_module(module), name)(json.loads(sys.argv[2]))))
