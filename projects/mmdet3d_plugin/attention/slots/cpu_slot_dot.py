"""The C++ kernel of the CPU's window slot dot products (``slot_dot_cpu.cpp``, the ``'cpp'`` formulation).

``torch.sparse.sampled_addmm``, the ``'sparse'`` formulation's dot product,
reads each slot's key row without prefetching it, so it is slower than
``embedding_bag`` reading the same rows for the weighted sum. The C++ kernel
prefetches the rows and uses AVX2 where the processor has it.
It is compiled once, by ``tools/setup_env.sh`` (:func:`main`), into
``$CMT_AQR_HOME/extensions`` (default ``~/.cache/cmt-aqr/extensions``), with
torch's ``cpp_extension`` (a C++ compiler and ninja, which setup installs).
Nothing compiles it at import or at run time: the first CPU slot product of
a process imports the built library, after checking that it was built from
this source. Where it was not built (an environment made without setup), or
from another version of the source (run setup again),
:func:`not_available_reasons` says why and
:func:`~.window_slots.default_formulation` falls back to ``'sparse'``.
"""
import functools
import hashlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import List, Optional, Tuple

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name('slot_dot_cpu.cpp')
#: the compiled module's name (its shared library is ``<name>.so`` in :func:`build_directory`)
EXTENSION_NAME = 'cmt_aqr_slot_dot_cpu'
COMPILE_FLAGS = ('-O3', '-fopenmp')
LINK_FLAGS = ('-fopenmp', )
#: the file in the build directory that records which source and flags the library was built from
BUILT_FROM = 'built_from.sha256'


def build_directory() -> Path:
    """Where the kernel is compiled: ``$CMT_AQR_HOME/extensions/<torch and Python version>`` (the setup's cache)."""
    cache = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    home = os.environ.get('CMT_AQR_HOME') or os.path.join(cache, 'cmt-aqr')
    version = f'torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}'
    return Path(home) / 'extensions' / version


def _source_hash() -> str:
    """The SHA-256 of the source and the flags: what a build is of."""
    return hashlib.sha256(SOURCE.read_bytes() + repr((COMPILE_FLAGS, LINK_FLAGS)).encode()).hexdigest()


def build(verbose: bool = False) -> ModuleType:
    """Compile the kernel with torch's ``cpp_extension`` (ninja rebuilds only what changed) and load it."""
    from torch.utils.cpp_extension import load  # imported here: it probes for CUDA, unneeded on import
    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    # fresh lists: torch's load appends its own flags to the ones it is given
    module = load(EXTENSION_NAME, [str(SOURCE)], extra_cflags=list(COMPILE_FLAGS), extra_ldflags=list(LINK_FLAGS),
                  build_directory=str(directory), verbose=verbose)
    (directory / BUILT_FROM).write_text(_source_hash())
    return module


@functools.lru_cache(maxsize=None)
def _loaded() -> Tuple[Optional[ModuleType], Tuple[str, ...]]:
    """The built kernel module and no reason, or None and why it cannot be used (cached for the process).

    It imports the library :func:`build` left, without torch's build machinery (no compiler, no lock file shared
    with other processes), after checking that it was built from this source.
    """
    directory = build_directory()
    library, record = directory / f'{EXTENSION_NAME}.so', directory / BUILT_FROM
    if not library.is_file() or not record.is_file():
        return None, (f'the C++ slot kernel is not built in {directory} (tools/setup_env.sh builds it: make setup)',)
    if record.read_text().strip() != _source_hash():
        return None, (f'the C++ slot kernel in {directory} was built from another version of {SOURCE.name} '
                      f'(make setup rebuilds it)',)
    try:
        spec = importlib.util.spec_from_file_location(EXTENSION_NAME, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as error:
        return None, (f'the C++ slot kernel {library} does not load: {error}',)
    return module, ()


def _kernel() -> ModuleType:
    """The built kernel module; RuntimeError with the reasons where it cannot be used."""
    module, reasons = _loaded()
    if module is None:
        raise RuntimeError('; '.join(reasons))
    return module


def not_available_reasons() -> List[str]:
    """Why the ``'cpp'`` formulation cannot run here (empty when it can)."""
    return list(_loaded()[1])


def slot_dot(a: Tensor, table: Tensor, columns: Tensor, scale: float) -> Tensor:
    """``scale * a[r] . table[columns[r, j]]`` for every row ``r`` and slot ``j``.

    Args:
        a (Tensor): ``[R, d]`` float32 (made contiguous here).
        table (Tensor): ``[T, d]`` float32 with adjacent channels (any row stride).
        columns (Tensor): ``[R, L]`` int64, each in ``[0, T)`` (a column outside raises).
        scale (float): multiplier.

    Returns:
        Tensor: ``[R, L]`` float32.
    """
    return _kernel().slot_dot(a.contiguous(), table, columns.contiguous(), float(scale))


def code_path(dim: int) -> str:
    """``'avx2'`` or ``'portable'``: the loop :func:`slot_dot` runs for ``dim`` channels on this processor."""
    return _kernel().slot_dot_path(dim)


def main() -> None:
    """Build the kernel (``tools/setup_env.sh``) and say where it is and which loop it runs at head dim 32."""
    start = time.time()
    module = build()
    print(f'C++ slot kernel ready in {build_directory()} ({time.time() - start:.0f} s; '
          f'head dim 32 runs the {module.slot_dot_path(32)} loop)')
