"""Which build of the compiled dependencies ``tools/setup_env.sh`` installs: CPU or CUDA.

Standard library only (with its checks, ``tools/setup_support/cuda_toolchain.py``): the setup runs it before
any package of the stack is installed::

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
  and spconv-cu126 runs with torch 2.11+cu130); with a GPU but no ``nvcc``
  (``auto``) spconv's CUDA build too, mmcv's ops staying CPU-only.
* **FORCE_CUDA**: ``1`` in CUDA mode, else ``0``; **MAX_JOBS** (:func:`max_jobs`): compile jobs by cores and memory.

Before anything is installed it stops, naming all three, when torch's CUDA,
``nvcc``'s and the driver's cannot work together (:func:`check_cuda_versions`).
"""
import argparse
import os
import shutil
import sys
from typing import Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script by the bare interpreter
from setup_support.cuda_toolchain import (available_memory_gb, check_cuda_versions, driver_cuda,  # noqa: E402
                                          gpu_visible, max_jobs, nvcc_cuda, parse_cuda_version)

SPCONV_VERSION = '2.3.8'
#: spconv's CUDA builds of SPCONV_VERSION on PyPI, (CUDA version, package), oldest first
SPCONV_CUDA_BUILDS = (((11, 8), 'spconv-cu118'), ((12, 1), 'spconv-cu121'), ((12, 4), 'spconv-cu124'),
                      ((12, 6), 'spconv-cu126'))
DEVICES = ('auto', 'cpu', 'cuda')


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
