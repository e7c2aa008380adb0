"""Race-free CPU sparse convolutions for spconv 2.3, on its CPU build and on its CUDA builds.

spconv runs every CPU sparse convolution with the native algorithm (forward and backward of ``SubMConv3d`` /
``SparseConv3d`` / inverse convolutions) as gather -> matrix product -> scatter-add per kernel offset. Its
compiled scatter-add (``GatherCPU::scatter_add``, exported as ``SpconvOps.scatter_add_cpu``) parallelises the
rows with OpenMP but declares the row pointers ``buf`` and ``out_ptr`` *outside* the parallel lambda, which
captures them by reference: all threads share the two pointers. When a thread is preempted between setting
them and adding the row, another thread's pointers are used, so rows are added to the wrong output site or
twice: wrong by far more than rounding, intermittently and only under CPU contention. spconv's kernels use
torch's ``libgomp``, so ``OMP_NUM_THREADS`` and ``torch.set_num_threads`` set their thread count
(``sparse_conv_check.spconv_openmp_threads``).

CPU tensors reach that kernel by two routes, both behind ``spconv.pytorch.ops.indice_conv`` and
``indice_conv_backward``, which spconv's autograd functions call:

* the CPU build (``spconv``, ``GEMM_CPP is None``): a Python loop over the kernel offsets that calls
  ``SpconvOps.scatter_add_cpu``;
* the CUDA builds (``spconv-cu1xx``): ``ConvGemmOps.indice_conv`` / ``indice_conv_backward`` in C++, whose CPU
  branch runs the same loop with ``GatherCPU::scatter_add`` directly, where no Python patch reaches.

:func:`patch_spconv_cpu_scatter_add` therefore replaces the two entry points: CPU tensors go to
:func:`cpu_indice_conv` / :func:`cpu_indice_conv_backward`, the same per-offset loop in torch ops whose
scatter-add is :func:`scatter_add_rows` (gather the output rows, add, write them back: no shared state); tensors
on any other device go to spconv's own functions unchanged. :func:`is_spconv_cpu_scatter_add_patched` checks both.
"""
import contextlib
import functools
import inspect
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch

#: spconv's own ``spconv.pytorch.ops`` functions that :func:`patch_spconv_cpu_scatter_add` replaced, by name.
_SPCONV_FUNCTIONS: Dict[str, Callable] = {}


def scatter_add_rows(out: torch.Tensor, rows: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``out[indices[i]] += rows[i]`` for ``i < len(indices)``, in place; ``indices`` must be distinct.

    spconv's index pairs of one kernel offset map each input row to a
    different output row (its own OpenMP kernel adds the rows without atomics
    for that reason), so a gather-add-write is exact and about twice as fast
    as ``index_add_``, which must allow for duplicates.

    Args:
        out (torch.Tensor): ``(N_out, C)`` output features (CPU), modified in place.
        rows (torch.Tensor): ``(M, C)`` rows to add, ``M >= len(indices)``; rows past
            ``len(indices)`` are ignored.
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


def _kernel_offset_weights(filters: torch.Tensor) -> torch.Tensor:
    """``(KV, C_in, C_out)`` view of a spconv weight: one input-to-output matrix per kernel offset.

    spconv 2.3 stores ``KRSC`` (``(C_out, *kernel, C_in)``); the older layouts
    ``RSCK`` / ``RSKC`` are read as spconv reads them (``spconv.constants``).
    """
    from spconv.constants import ALL_WEIGHT_IS_KRSC, FILTER_HWIO
    if ALL_WEIGHT_IS_KRSC:
        return filters.reshape(filters.shape[0], -1, filters.shape[-1]).permute(1, 2, 0)
    per_offset = filters.reshape(-1, *filters.shape[-2:])
    return per_offset if FILTER_HWIO else per_offset.transpose(1, 2)


def _active_offsets(indice_pair_num: torch.Tensor, max_pairs: int, subm: bool) -> List[Tuple[int, int]]:
    """``(kernel offset, number of pairs)`` of every offset spconv's CPU loop visits, in its order.

    A submanifold convolution's centre offset maps every site to itself (done
    by one matrix product beforehand), and spconv reads the pair count of an
    offset past the centre from its mirror offset.
    """
    counts = indice_pair_num.cpu().clamp(max=max_pairs).tolist()
    kv, centre = len(counts), len(counts) // 2
    offsets = []
    for offset in range(kv):
        if subm and offset == centre:
            continue
        count = counts[kv - offset - 1] if subm and offset > centre else counts[offset]
        if count > 0:
            offsets.append((offset, count))
    return offsets


def cpu_indice_conv(features: torch.Tensor, filters: torch.Tensor, indice_pairs: torch.Tensor,
                    indice_pair_num: torch.Tensor, num_activate_out: int, inverse: bool = False,
                    subm: bool = False) -> torch.Tensor:
    """spconv's CPU sparse convolution (``ops.indice_conv``) with the race-free :func:`scatter_add_rows`.

    Args:
        features (torch.Tensor): ``(N_in, C_in)`` input features.
        filters (torch.Tensor): the layer's weight in spconv's layout.
        indice_pairs (torch.Tensor): ``(2, KV, P)`` input / output row of each pair, per kernel offset.
        indice_pair_num (torch.Tensor): ``(KV,)`` number of valid pairs per kernel offset.
        num_activate_out (int): N_out, the number of active output sites.
        inverse (bool): an inverse convolution (pairs read output -> input).
        subm (bool): a submanifold convolution (outputs at the input sites).

    Returns:
        torch.Tensor: ``(N_out, C_out)`` output features.
    """
    weights = _kernel_offset_weights(filters)
    pairs_in, pairs_out = indice_pairs[int(inverse)], indice_pairs[int(not inverse)]
    if subm:
        out = torch.mm(features, weights[weights.shape[0] // 2])
    else:
        out = features.new_zeros(num_activate_out, weights.shape[2])
    for offset, count in _active_offsets(indice_pair_num, indice_pairs.shape[-1], subm):
        rows = torch.mm(features.index_select(0, pairs_in[offset, :count].long()), weights[offset])
        scatter_add_rows(out, rows, pairs_out[offset, :count])
    return out


def cpu_indice_conv_backward(features: torch.Tensor, filters: torch.Tensor, out_bp: torch.Tensor,
                             indice_pairs: torch.Tensor, indice_pair_num: torch.Tensor, inverse: bool = False,
                             subm: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """spconv's CPU sparse-convolution backward (``ops.indice_conv_backward``), race-free.

    Args:
        features (torch.Tensor): ``(N_in, C_in)`` input features of the forward pass.
        filters (torch.Tensor): the layer's weight in spconv's layout.
        out_bp (torch.Tensor): ``(N_out, C_out)`` gradient of the output features.
        indice_pairs, indice_pair_num, inverse, subm: as in :func:`cpu_indice_conv`.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: gradients of ``features`` and of ``filters`` (same layout).
    """
    weights = _kernel_offset_weights(filters)
    dfilters = torch.zeros(filters.shape, dtype=filters.dtype, device=filters.device)
    dweights = _kernel_offset_weights(dfilters)
    pairs_in, pairs_out = indice_pairs[int(inverse)], indice_pairs[int(not inverse)]
    if subm:
        centre = weights.shape[0] // 2
        dweights[centre] = torch.mm(features.t(), out_bp)
        din = torch.mm(out_bp, weights[centre].t())
    else:
        din = torch.zeros(features.shape, dtype=features.dtype, device=features.device)
    for offset, count in _active_offsets(indice_pair_num, indice_pairs.shape[-1], subm):
        rows_in, rows_out = pairs_in[offset, :count], pairs_out[offset, :count]
        inputs, grads = features.index_select(0, rows_in.long()), out_bp.index_select(0, rows_out.long())
        dweights[offset] = torch.mm(inputs.t(), grads)
        scatter_add_rows(din, torch.mm(grads, weights[offset].t()), rows_in)
    return din, dfilters


@functools.lru_cache(maxsize=None)
def _signature(function: Callable) -> inspect.Signature:
    """``inspect.signature(function)``, computed once per function."""
    return inspect.signature(function)


def _route(name: str, cpu_function: Callable, args: tuple, kwargs: dict) -> Any:
    """Call spconv's ``ops.<name>`` for tensors on a GPU, ``cpu_function`` for CPU tensors.

    Raises:
        NotImplementedError: a fused bias or activation for CPU tensors (spconv has none on the CPU either).
    """
    spconv_function = _SPCONV_FUNCTIONS[name]
    signature = _signature(spconv_function)
    call = signature.bind(*args, **kwargs)
    if call.arguments['features'].device.type != 'cpu':
        return spconv_function(*args, **kwargs)
    no_activation = signature.parameters['act_type'].default if 'act_type' in signature.parameters else None
    if call.arguments.get('bias') is not None or call.arguments.get('act_type', no_activation) != no_activation:
        raise NotImplementedError('spconv has no fused bias or activation for CPU sparse convolutions')
    call.apply_defaults()
    return cpu_function(**{key: call.arguments[key] for key in _signature(cpu_function).parameters})


def _indice_conv(*args, **kwargs) -> torch.Tensor:
    """``spconv.pytorch.ops.indice_conv`` with CPU tensors routed to :func:`cpu_indice_conv`."""
    return _route('indice_conv', cpu_indice_conv, args, kwargs)


def _indice_conv_backward(*args, **kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
    """``spconv.pytorch.ops.indice_conv_backward`` with CPU tensors routed to :func:`cpu_indice_conv_backward`."""
    return _route('indice_conv_backward', cpu_indice_conv_backward, args, kwargs)


#: The entry points of ``spconv.pytorch.ops`` this module replaces, and their replacements.
_ENTRY_POINTS: Dict[str, Callable] = {'indice_conv': _indice_conv, 'indice_conv_backward': _indice_conv_backward}


def _spconv_ops():
    """``spconv.pytorch.ops``, or None when spconv 2 is not installed."""
    try:
        from spconv.pytorch import ops
    except ImportError:
        return None
    return ops


def patch_spconv_cpu_scatter_add() -> bool:
    """Route every CPU sparse convolution of spconv (either build) through the race-free :func:`scatter_add_rows`.

    Returns:
        bool: False when spconv 2 is not installed (nothing to patch).
    """
    ops = _spconv_ops()
    if ops is None:
        return False
    for name, replacement in _ENTRY_POINTS.items():
        current = getattr(ops, name)
        if current is not replacement:
            _SPCONV_FUNCTIONS[name] = current
            setattr(ops, name, replacement)
    return True


def is_spconv_cpu_scatter_add_patched() -> bool:
    """Whether every route of a CPU sparse convolution in spconv reaches the race-free scatter-add.

    True when both entry points that spconv's convolutions call
    (``spconv.pytorch.ops.indice_conv`` and ``indice_conv_backward``) are the
    replacements of :func:`patch_spconv_cpu_scatter_add`; False when spconv is
    not installed or either entry point is anything else.
    """
    ops = _spconv_ops()
    return ops is not None and all(getattr(ops, name) is replacement for name, replacement in _ENTRY_POINTS.items())


@contextlib.contextmanager
def builtin_spconv_scatter_add() -> Iterator[None]:
    """Run the body with spconv's own CPU sparse convolutions (to reproduce the race), then re-patch."""
    ops = _spconv_ops()
    if ops is None:
        raise ImportError('spconv 2 is not installed')
    patched = is_spconv_cpu_scatter_add_patched()
    for name, function in _SPCONV_FUNCTIONS.items():
        setattr(ops, name, function)
    try:
        yield
    finally:
        if patched:
            patch_spconv_cpu_scatter_add()


__all__ = [
    'builtin_spconv_scatter_add', 'cpu_indice_conv', 'cpu_indice_conv_backward', 'is_spconv_cpu_scatter_add_patched',
    'patch_spconv_cpu_scatter_add', 'scatter_add_rows'
]
