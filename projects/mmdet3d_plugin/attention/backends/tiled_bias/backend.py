"""``tiled_bias``: exact segment and window biases computed inside the tiles of a fused attention kernel.

The AQR bias has structure a kernel can evaluate from a few numbers per query
and per key instead of reading a ``[Q, K]`` tensor: a value per key segment
(the global bias) and a linearly decaying window around a centre cell on the
key grids (the local bias). The Triton kernels of :mod:`.kernels` (called
through the custom operators of :mod:`.ops`) run FlashAttention-2's tiling
(online softmax forward, backward recomputing the scores from the
log-sum-exp) and add, in every tile of scores, the bias of each query and key
from the tables of :mod:`.tables`: the key's grid, plane, row, column and
segment, and the query's centre per grid. Nothing of size ``Q * K`` is read
or written, no key is gathered, and the backward returns the gradients of the
window amplitudes and segment values as row sums of the score gradient (no
atomics): one forward kernel and two backward kernels per call, whatever the
bias.

Runs SegmentBias and WindowBias parts (and no bias), a key padding mask, in
float32, float16 and bfloat16, head dims up to :data:`MAX_HEAD_DIM`; no
dropout. CUDA tensors, or CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, how the CPU tests check it against ``math``).
``auto`` tries it first where :data:`~...dispatch.STRUCTURED_BIAS_FIRST` names
the device type (CUDA by default: faster on the GPU than ``segment`` and
dense ``sdpa`` for both AQR biases; see docs/results.md).
"""
import functools
from typing import List, Tuple

import torch
from torch import Tensor

from ...bias import SegmentBias, WindowBias
from ..base import AttentionBackend, AttentionCall, segment_window_reasons, sum_broadcast_heads
from ..segment.backend import segment_layout
from ...triton_device import triton_not_supported_reasons
from . import ops
from .tables import TileBiasTables, key_cells, window_centres

#: largest head dim (one ``[BLOCK, d]`` tile of q, k, v and the accumulators stay in registers)
MAX_HEAD_DIM = 128
#: input dtypes of the kernels (accumulated in float32)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: oldest CUDA compute capability the kernels run on: their products use tensor cores in ``tf32x3`` (float32) and
#: bfloat16, which need Ampere (8.0); ``tools/kernel_registers.py --arch 80`` compiles them for 8.0 without a GPU.
#: On an older GPU ``auto`` falls back to the size rule's backends
MIN_COMPUTE_CAPABILITY = (8, 0)


class TiledBiasFunction(torch.autograd.Function):
    """The kernels' forward and backward; differentiable w.r.t. q, k, v, the amplitudes and the segment values."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, amplitude: Tensor, values: Tensor, tables: TileBiasTables,
                scale: float) -> Tensor:
        """Args: q ``[bs, heads, Q, d]``, k / v ``[bs, heads, K, d]``; amplitude ``[G, bs, heads | 1, Q]`` and
        values ``[bs, heads | 1, Q, S]`` float32; tables; scale. Returns ``[bs, heads, Q, d]`` in q's dtype."""
        out, lse = ops.tiled_bias_forward(q, k, v, *_bias_tensors(tables, amplitude, values, q.size(1)), scale)
        ctx.save_for_backward(q, k, v, amplitude, values, out, lse)
        ctx.tables, ctx.scale = tables, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, amplitude, values, out, lse = ctx.saved_tensors
        tables = ctx.tables
        dq, dk, dv, d_terms = ops.tiled_bias_backward(grad_out, q, k, v, out, lse,
                                                      *_bias_tensors(tables, amplitude, values, q.size(1)),
                                                      ctx.scale)
        d_amplitude = sum_broadcast_heads(d_terms[..., :tables.num_grids].permute(3, 0, 1, 2), 2, amplitude.size(2))
        d_values = sum_broadcast_heads(d_terms[..., tables.num_grids:], 1, values.size(1))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_amplitude, d_values, None, None


def _bias_tensors(tables: TileBiasTables, amplitude: Tensor, values: Tensor, heads: int) -> tuple:
    """The bias arguments of the :mod:`.ops` operators, the amplitudes and values expanded to ``heads``."""
    return (tables.keys, tables.centres, tables.inv_half, amplitude.expand(-1, -1, heads, -1),
            values.expand(-1, heads, -1, -1), tables.padding)


@functools.lru_cache(maxsize=None)
def _compute_capability(index: int) -> Tuple[int, int]:
    """``(major, minor)`` of CUDA device ``index``, asked once per device."""
    return tuple(torch.cuda.get_device_capability(index))


class TiledBiasBackend(AttentionBackend):
    """Exact :class:`SegmentBias` and :class:`WindowBias` evaluated inside the tiles of a Triton attention kernel."""

    name = 'tiled_bias'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        reasons = segment_window_reasons(call, self.name)
        if call.q.dtype not in DTYPES:
            reasons.append(f'tiled_bias runs float32, float16 and bfloat16, got {call.q.dtype}')
        if call.head_dim > MAX_HEAD_DIM:
            reasons.append(f'tiled_bias runs head dims up to {MAX_HEAD_DIM}, got {call.head_dim}')
        if call.device_type == 'cuda' and torch.cuda.is_available():  # fake CUDA (the tests) has no GPU to ask
            index = call.q.device.index
            capability = _compute_capability(torch.cuda.current_device() if index is None else index)
            if capability < MIN_COMPUTE_CAPABILITY:
                reasons.append('tiled_bias runs on GPUs of compute capability {}.{} or later (tensor-core tf32x3 and '
                               'bfloat16 products), got {}.{}'.format(*MIN_COMPUTE_CAPABILITY, *capability))
        return reasons + triton_not_supported_reasons(call.device_type, 'the tiled_bias kernels')

    def forward(self, call: AttentionCall) -> Tensor:
        tables, amplitude, values = self._tables(call)
        with torch.autocast(call.device_type, enabled=False):
            return TiledBiasFunction.apply(call.q, call.k, call.v, amplitude, values, tables, call.scale)

    @staticmethod
    def _tables(call: AttentionCall) -> Tuple[TileBiasTables, Tensor, Tensor]:
        """The call's tables, its ``[G, bs, heads | 1, Q]`` amplitudes and ``[bs, heads | 1, Q, S]`` segment
        values (float32; empty in their last dims where the bias has no such term)."""
        bias, q = call.bias, call.q
        bs, _, num_queries, _ = q.shape
        num_keys = call.k.size(2)
        segments = bias.parts_of_type(SegmentBias) if bias is not None else []
        windows = bias.parts_of_type(WindowBias) if bias is not None else []
        bounds, values = segment_layout(segments, num_keys)
        if values is None:
            values = q.new_zeros((bs, 1, num_queries, 0), dtype=torch.float32)

        def shape_tables() -> Tuple[Tensor, Tensor, Tensor]:
            grids, centres, inv_half = window_centres(windows) if windows else ([], None, None)
            if not windows:
                centres = torch.zeros((0, bs, num_queries, 3), dtype=torch.int32, device=q.device)
                inv_half = torch.zeros((0, ), dtype=torch.float32, device=q.device)
            return key_cells(grids, bounds if segments else None, num_keys, q.device), centres, inv_half

        if bias is not None:
            keys, centres, inv_half = bias.derived(('tiled_bias_tables', num_keys, tuple(bounds)), shape_tables)
        else:
            keys, centres, inv_half = shape_tables()
        if windows:
            amplitudes = [a.float() for part in windows for a in part.amplitude]
            heads = max(a.size(1) for a in amplitudes)
            amplitude = torch.stack([a.expand(-1, heads, -1) for a in amplitudes])
        else:
            amplitude = q.new_zeros((0, bs, 1, num_queries), dtype=torch.float32)
        padding = None if call.key_padding_mask is None else call.key_padding_mask.to(torch.uint8)
        tables = TileBiasTables(keys, centres, inv_half, values.size(-1), padding)
        return tables, amplitude, values
