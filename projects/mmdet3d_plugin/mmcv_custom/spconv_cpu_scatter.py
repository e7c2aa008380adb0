"""A race-free replacement for spconv 2.3's CPU ``scatter_add``.

spconv runs every CPU sparse convolution (forward of ``SubMConv3d`` /
``SparseConv3d`` and the backward of both) as gather -> ``torch.mm`` ->
``SpconvOps.scatter_add_cpu`` per kernel offset. Its compiled
``scatter_add_cpu`` (``spconv/csrc/sparse/gather.py``) parallelises the rows
with OpenMP (``tv::kernel_1d``) but declares the row pointers ``buf`` and
``out_ptr`` *outside* the parallel lambda, which captures them by reference:
all OpenMP threads share the two pointers. When a thread is preempted between
setting them and adding the row (two threads on a loaded machine), another
thread's pointers are used, so rows are added to the wrong output site or
twice. The result is wrong by far more than rounding, intermittently and only
under CPU contention. spconv bundles its own ``libgomp``, so
``torch.set_num_threads`` does not limit these threads; only ``OMP_NUM_THREADS``
does.

:func:`scatter_add_rows` does the same operation with torch's indexing ops
(gather the output rows, add, write them back: no shared state, torch's own
threads), and
:func:`patch_spconv_cpu_scatter_add` installs it in place of spconv's kernel.
spconv only calls ``scatter_add_cpu`` on its CPU path, so CUDA runs are
unaffected.
"""
import contextlib
from typing import Callable, Iterator, Optional

import torch

_BUILTIN_SCATTER_ADD: Optional[Callable] = None


def _tv_to_torch(tensor) -> torch.Tensor:
    """A torch view (shared memory) of a CPU ``cumm.tensorview.Tensor``."""
    try:
        array = tensor.numpy_view()
    except Exception as error:  # tv raises RuntimeError/ValueError for dtypes numpy lacks
        raise TypeError(f'spconv CPU scatter_add: unsupported tensor (dtype code {tensor.dtype}): {error}') from error
    return torch.from_numpy(array)


def scatter_add_rows(out: torch.Tensor, rows: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``out[indices[i]] += rows[i]`` for ``i < len(indices)``, in place; ``indices`` must be distinct.

    spconv calls it once per kernel offset, whose index pairs map each input
    row to a different output row (its own OpenMP kernel adds the rows without
    atomics for that reason), so a gather-add-write is exact and about twice as
    fast as ``index_add_``, which must allow for duplicates.

    Args:
        out (torch.Tensor): ``(N_out, C)`` output features (CPU), modified in place.
        rows (torch.Tensor): ``(M, C)`` rows to add, ``M >= len(indices)``; rows past
            ``len(indices)`` are ignored (spconv passes its whole reusable buffer).
        indices (torch.Tensor): ``(K,)`` distinct integer output row of each added row.

    Returns:
        torch.Tensor: ``out``.
    """
    if out.dim() != 2 or rows.dim() != 2 or indices.dim() != 1:
        raise ValueError(f'scatter_add_rows expects (N, C), (M, C), (K,); got {tuple(out.shape)}, '
                         f'{tuple(rows.shape)}, {tuple(indices.shape)}')
    if out.shape[1] != rows.shape[1] or rows.shape[0] < indices.shape[0]:
        raise ValueError(f'scatter_add_rows: rows {tuple(rows.shape)} do not fit out {tuple(out.shape)} '
                         f'and {indices.shape[0]} indices')
    if out.is_cuda or rows.is_cuda or indices.is_cuda:
        raise ValueError('scatter_add_rows replaces spconv\'s CPU kernel only; got a CUDA tensor')
    index = indices.long()
    return out.index_copy_(0, index, out.index_select(0, index).add_(rows[:index.shape[0]]))


def _spconv_scatter_add_cpu(out, inp, inds) -> None:
    """spconv's ``SpconvOps.scatter_add_cpu`` signature over tensorview tensors."""
    scatter_add_rows(_tv_to_torch(out), _tv_to_torch(inp), _tv_to_torch(inds))


def patch_spconv_cpu_scatter_add() -> bool:
    """Replace ``SpconvOps.scatter_add_cpu`` by the race-free :func:`scatter_add_rows`.

    Returns:
        bool: False when spconv 2 is not installed (nothing to patch).
    """
    try:
        from spconv.core_cc.csrc.sparse.all import SpconvOps
    except ImportError:
        return False
    global _BUILTIN_SCATTER_ADD
    if SpconvOps.scatter_add_cpu is not _spconv_scatter_add_cpu:
        _BUILTIN_SCATTER_ADD = SpconvOps.scatter_add_cpu
        SpconvOps.scatter_add_cpu = staticmethod(_spconv_scatter_add_cpu)
    return True


def spconv_builtin_scatter_add_cpu() -> Callable:
    """spconv's own (racy) compiled ``scatter_add_cpu``, for reproducers and tests."""
    from spconv.core_cc.csrc.sparse.all import SpconvOps
    return _BUILTIN_SCATTER_ADD if _BUILTIN_SCATTER_ADD is not None else SpconvOps.scatter_add_cpu


@contextlib.contextmanager
def builtin_spconv_scatter_add() -> Iterator[None]:
    """Run the body with spconv's own ``scatter_add_cpu`` (to reproduce the race), then re-patch."""
    from spconv.core_cc.csrc.sparse.all import SpconvOps
    patched = is_spconv_cpu_scatter_add_patched()
    SpconvOps.scatter_add_cpu = staticmethod(spconv_builtin_scatter_add_cpu())
    try:
        yield
    finally:
        if patched:
            SpconvOps.scatter_add_cpu = staticmethod(_spconv_scatter_add_cpu)


def is_spconv_cpu_scatter_add_patched() -> bool:
    """Whether spconv's CPU ``scatter_add`` is the race-free replacement."""
    try:
        from spconv.core_cc.csrc.sparse.all import SpconvOps
    except ImportError:
        return False
    return SpconvOps.scatter_add_cpu is _spconv_scatter_add_cpu


__all__ = [
    'builtin_spconv_scatter_add', 'is_spconv_cpu_scatter_add_patched', 'patch_spconv_cpu_scatter_add',
    'scatter_add_rows', 'spconv_builtin_scatter_add_cpu'
]
