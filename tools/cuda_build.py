"""Which build of the compiled dependencies ``tools/setup_env.sh`` installs: CPU or CUDA.

Standard library only: the setup runs this file as a script before any
package of the stack is installed::

    python tools/cuda_build.py --device auto [--torch-cuda 13.0]

prints one line, ``<mode> <spconv requirement> <FORCE_CUDA> <MAX_JOBS>``, e.g.
``cpu spconv==2.3.8 0 2`` or ``cuda spconv-cu126==2.3.8 1 16``, and the
reasons on stderr. The choices:

* **mode** (:func:`build_mode`): ``CMT_AQR_DEVICE=cpu`` or ``cuda`` forces
  it; ``auto`` (the default) builds for CUDA only where a GPU is visible
  (``nvidia-smi -L`` lists one) and ``nvcc`` is there to compile mmcv-full's
  CUDA ops. ``nvcc`` alone (a CPU machine with the toolkit installed, as this
  project's CI machines have) keeps the CPU build.
* **spconv** (:func:`spconv_requirement`): the CPU build ``spconv``, or the
  newest CUDA build not newer than torch's CUDA (:data:`SPCONV_CUDA_BUILDS`;
  ``spconv-cu126`` for torch's CUDA 12.6 to 13.x: there is no CUDA 13 build,
  and spconv-cu126 runs with torch 2.11+cu130).
* **FORCE_CUDA** for mmcv-full's compilation: ``1`` in CUDA mode, else ``0``.
* **MAX_JOBS** (:func:`max_jobs`): parallel compile jobs, bounded by the cores
  and by the available memory (an ``nvcc`` job can take ~4 GB).

Before anything is installed it checks (:func:`check_cuda_versions`) that
torch's CUDA, ``nvcc``'s and the driver's can work together, and stops naming
all three when they cannot. ``auto`` with a GPU but no ``nvcc`` installs
spconv's CUDA build and says which ops stay on the CPU.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from typing import Callable, Optional, Sequence, Tuple

SPCONV_VERSION = '2.3.8'
#: spconv's CUDA builds of SPCONV_VERSION on PyPI, (CUDA version, package), oldest first
SPCONV_CUDA_BUILDS = (((11, 8), 'spconv-cu118'), ((12, 1), 'spconv-cu121'), ((12, 4), 'spconv-cu124'),
                      ((12, 6), 'spconv-cu126'))
DEVICES = ('auto', 'cpu', 'cuda')


def gpu_visible(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> bool:
    """Whether ``nvidia-smi -L`` lists a GPU."""
    if shutil.which('nvidia-smi') is None:
        return False
    try:
        listed = run(['nvidia-smi', '-L'], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and any(line.startswith('GPU ') for line in listed.stdout.splitlines())


def _tool_output(command: Sequence[str], run: Callable[..., subprocess.CompletedProcess]) -> Optional[str]:
    """stdout of ``command``, or None when it is not on PATH or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        result = run(list(command), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def nvcc_cuda(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Optional[str]:
    """The CUDA version of ``nvcc`` (``'13.0'`` from ``nvcc --version``'s ``release 13.0``), or None."""
    found = re.search(r'release (\d+\.\d+)', _tool_output(['nvcc', '--version'], run) or '')
    return found.group(1) if found else None


def driver_cuda(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Optional[str]:
    """The newest CUDA the driver runs (``nvidia-smi``'s ``CUDA Version: 13.0``), or None without a driver."""
    found = re.search(r'CUDA Version:\s*(\d+\.\d+)', _tool_output(['nvidia-smi'], run) or '')
    return found.group(1) if found else None


def check_cuda_versions(mode: str, has_gpu: bool, torch_cuda: Optional[str], nvcc: Optional[str],
                        driver: Optional[str]) -> None:
    """Stop before installing when torch's CUDA cannot work with ``nvcc``'s (CUDA mode) or the driver's (a GPU).

    mmcv-full's CUDA ops are compiled against torch's headers: torch refuses an ``nvcc`` of another CUDA major.
    A driver runs code of its own CUDA major and older only.

    Raises:
        ValueError: naming torch's, nvcc's and the driver's CUDA versions.
    """
    torch_version = parse_cuda_version(torch_cuda)
    if torch_version is None or (mode != 'cuda' and not has_gpu):
        return
    problems = []
    nvcc_version = parse_cuda_version(nvcc)
    if mode == 'cuda' and nvcc_version is not None and nvcc_version[0] != torch_version[0]:
        problems.append("nvcc's CUDA major differs from torch's: mmcv-full's CUDA ops would not build")
    driver_version = parse_cuda_version(driver)
    if has_gpu and driver_version is not None and driver_version[0] < torch_version[0]:
        problems.append("the driver is older than torch's CUDA major: torch could not use the GPU")
    if problems:
        raise ValueError(f"torch {torch_cuda}, nvcc {nvcc or 'absent'}, driver {driver or 'absent'}: "
                         f"{'; '.join(problems)}. Install an nvcc / a driver for CUDA {torch_version[0]}.x, "
                         f"or set CMT_AQR_DEVICE=cpu")


#: memory one parallel compile job may take, GB (nvcc on mmcv's CUDA sources; g++ on its CPU ones)
COMPILE_JOB_GB = dict(cuda=4.0, cpu=1.5)


def available_memory_gb(meminfo: str = '/proc/meminfo') -> Optional[float]:
    """``MemAvailable`` in GB, or None where the file does not say."""
    try:
        with open(meminfo) as f:
            found = re.search(r'^MemAvailable:\s+(\d+) kB', f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) / 1024 ** 2 if found else None


def max_jobs(mode: str, cpus: int, memory_gb: Optional[float]) -> int:
    """Parallel compile jobs: one per core, as many as ``memory_gb`` holds (:data:`COMPILE_JOB_GB`), at least 1."""
    fitting = cpus if memory_gb is None else int(memory_gb // COMPILE_JOB_GB[mode])
    return max(1, min(cpus, fitting))


def build_mode(requested: str, has_nvcc: bool, has_gpu: bool) -> Tuple[str, str]:
    """``('cpu' | 'cuda', why)``.

    Raises:
        ValueError: an unknown ``requested``, or ``'cuda'`` without ``nvcc``.
    """
    if requested not in DEVICES:
        raise ValueError(f'CMT_AQR_DEVICE must be one of {list(DEVICES)}, got {requested!r}')
    if requested == 'cuda':
        if not has_nvcc:
            raise ValueError('CMT_AQR_DEVICE=cuda needs nvcc (the CUDA toolkit) on PATH to compile mmcv-full\'s CUDA '
                             'ops; install it or set CMT_AQR_DEVICE=cpu')
        return 'cuda', 'CMT_AQR_DEVICE=cuda'
    if requested == 'cpu':
        return 'cpu', 'CMT_AQR_DEVICE=cpu'
    if has_gpu and has_nvcc:
        return 'cuda', 'a GPU is visible (nvidia-smi -L) and nvcc is on PATH'
    if has_gpu:
        return 'cpu', ('a GPU is visible but nvcc is not on PATH: torch and spconv run on the GPU, mmcv-full\'s '
                       'compiled ops (mmcv.ops: Voxelization, NMS, box IoU, ...) are built for the CPU only and refuse '
                       'CUDA tensors; install the CUDA toolkit and rerun with CMT_AQR_DEVICE=cuda for them')
    return 'cpu', 'no GPU visible (nvidia-smi -L)'


def parse_cuda_version(version: Optional[str]) -> Optional[Tuple[int, int]]:
    """``'12.6'`` -> ``(12, 6)``; None or ``''`` (a CPU build of torch) -> None."""
    if not version:
        return None
    try:
        major, minor = version.split('.')[:2]
        return int(major), int(minor)
    except ValueError:
        raise ValueError(f'cannot read the CUDA version {version!r} (expected MAJOR.MINOR, as torch.version.cuda)')


def spconv_requirement(mode: str, torch_cuda: Optional[str], has_gpu: bool = False) -> str:
    """The spconv requirement for ``mode`` and torch's CUDA version (``torch.version.cuda``): the CUDA build in
    CUDA mode, and with a visible GPU (``has_gpu``) and a CUDA build of torch even where mmcv's ops are CPU-only.

    Raises:
        ValueError: CUDA mode with a CPU build of torch, or a CUDA older than every spconv build.
    """
    if mode == 'cpu' and not (has_gpu and parse_cuda_version(torch_cuda)):
        return f'spconv=={SPCONV_VERSION}'
    version = parse_cuda_version(torch_cuda)
    if version is None:
        raise ValueError('CUDA mode needs a CUDA build of torch (torch.version.cuda is None)')
    fitting = [package for build, package in SPCONV_CUDA_BUILDS if build <= version]
    if not fitting:
        oldest = '.'.join(map(str, SPCONV_CUDA_BUILDS[0][0]))
        raise ValueError(f'torch is built for CUDA {torch_cuda}, older than every spconv {SPCONV_VERSION} CUDA build '
                         f'(the oldest is for CUDA {oldest})')
    return f'{fitting[-1]}=={SPCONV_VERSION}'


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='auto', help="'auto' (default), 'cpu' or 'cuda'")
    parser.add_argument('--torch-cuda', default=None, help="torch.version.cuda ('' for a CPU build)")
    args = parser.parse_args(argv)
    has_gpu = gpu_visible()
    try:
        mode, why = build_mode(args.device, shutil.which('nvcc') is not None, has_gpu)
        check_cuda_versions(mode, has_gpu, args.torch_cuda, nvcc_cuda(), driver_cuda())
        known = args.torch_cuda is not None or (mode == 'cpu' and not has_gpu)
        spconv = spconv_requirement(mode, args.torch_cuda, has_gpu) if known else '-'
    except ValueError as error:
        print(f'cuda_build: {error}', file=sys.stderr)
        return 2
    jobs = max_jobs(mode, os.cpu_count() or 1, available_memory_gb())
    print(f'{mode} {spconv} {int(mode == "cuda")} {jobs}')
    print(f'cuda_build: {mode} build ({why}); spconv: {spconv}; {jobs} compile jobs', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
