"""What the machine's CUDA toolchain is and whether it can build this stack: ``tools/cuda_build.py``'s checks.

Standard library only (``tools/setup_env.sh`` runs them with the bare interpreter, before anything is installed):

* :func:`gpu_visible`, :func:`nvcc_cuda`, :func:`driver_cuda`: what ``nvidia-smi -L``, ``nvcc --version`` and
  ``nvidia-smi`` say (None or False where the tool is absent or fails);
* :func:`check_cuda_versions`: torch's CUDA against nvcc's (CUDA mode) and the driver's (any GPU);
* :func:`max_jobs`: parallel compile jobs bounded by the cores and the available memory.
"""
import re
import shutil
import subprocess
from typing import Callable, Optional, Sequence, Tuple


def gpu_visible(run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> bool:
    """Whether ``nvidia-smi -L`` lists a GPU."""
    if shutil.which('nvidia-smi') is None:
        return False
    try:
        listed = run(['nvidia-smi', '-L'], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and any(line.startswith('GPU ') for line in listed.stdout.splitlines())


def parse_cuda_version(version: Optional[str]) -> Optional[Tuple[int, int]]:
    """``'12.6'`` -> ``(12, 6)``; None or ``''`` (a CPU build of torch) -> None."""
    if not version:
        return None
    try:
        major, minor = version.split('.')[:2]
        return int(major), int(minor)
    except ValueError:
        raise ValueError(f'cannot read the CUDA version {version!r} (expected MAJOR.MINOR, as torch.version.cuda)')


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
