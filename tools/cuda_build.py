"""Which build of the compiled dependencies ``tools/setup_env.sh`` installs: CPU or CUDA.

Standard library only: the setup runs this file as a script before any
package of the stack is installed::

    python tools/cuda_build.py --device auto [--torch-cuda 13.0]

prints one line, ``<mode> <spconv requirement> <FORCE_CUDA>``, e.g.
``cpu spconv==2.3.8 0`` or ``cuda spconv-cu126==2.3.8 1``, and the reason
on stderr. The choices:

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
"""
import argparse
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
        return 'cpu', 'a GPU is visible but nvcc is not on PATH: mmcv-full is built with CPU ops only'
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


def spconv_requirement(mode: str, torch_cuda: Optional[str]) -> str:
    """The spconv requirement for ``mode`` and torch's CUDA version (``torch.version.cuda``).

    Raises:
        ValueError: CUDA mode with a CPU build of torch, or a CUDA older than every spconv build.
    """
    if mode == 'cpu':
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
    try:
        mode, why = build_mode(args.device, shutil.which('nvcc') is not None, gpu_visible())
        spconv = spconv_requirement(mode, args.torch_cuda) if args.torch_cuda is not None or mode == 'cpu' else '-'
    except ValueError as error:
        print(f'cuda_build: {error}', file=sys.stderr)
        return 2
    print(f'{mode} {spconv} {int(mode == "cuda")}')
    print(f'cuda_build: {mode} build ({why}); spconv: {spconv}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
