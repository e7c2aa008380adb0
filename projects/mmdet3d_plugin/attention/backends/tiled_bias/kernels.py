"""Triton kernels of the ``tiled_bias`` backend: attention whose segment and window bias is computed inside each
``[BLOCK_Q, BLOCK_K]`` tile of scores, from the queries' centres and the keys' cells.

Three kernels, in the manner of FlashAttention-2 (online softmax in the forward, the scores recomputed in the
backward from the saved log-sum-exp):

* :func:`tiled_bias_forward`: a program per (sample x head, block of queries) runs over the key tiles and
  returns the output and the float32 log-sum-exp ``[bs, heads, Q]`` of the biased scores;
* :func:`tiled_bias_backward`: a program per (sample x head, block of keys) accumulates ``dk`` and ``dv``, and
  one per (sample x head, block of queries) ``dq`` and the gradients of the query's bias terms (window amplitude
  per grid, value per key segment): row sums of ``dS = P (dP - D)`` weighted by their coefficients, reduced in
  registers (no atomics, no ``[Q, K]`` tensor).

The bias of query ``q`` and key ``k`` (:func:`_tile_bias`)::

    values[q, segment(k)] + amplitude[grid(k), q] * max(0, 1 - |cell(k) - centre[grid(k), q]| * inv_half[grid(k)])

with the window term only where the key's plane is the query's centre plane on the key's grid (``centre`` plane
-1: no window there); :mod:`.tables` builds the key and query tables.

This module imports Triton (:mod:`.backend` imports it only when the backend runs). The kernels run on CUDA
tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (set before import), how the CPU tests check them
against ``math``. Float32 inputs multiply in ``tf32x3`` (about float32's accuracy on tensor cores), float16 /
bfloat16 in their own precision, all accumulated in float32.
"""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...triton_blocks import query_block_program

from .launch import launch_of
from .tables import TileBiasTables

#: software pipelining depth of the inner loops on a GPU
NUM_STAGES = 2


@triton.jit
def _rows(ptr, b, h, index, dims, s_b, s_h, s_i, s_d):
    """Pointers to the ``[len(index), BLOCK_D]`` rows ``index`` of sample ``b``, head ``h`` of a
    ``[bs, heads, L, d]`` tensor with strides ``s_*``."""
    return ptr + b * s_b + h * s_h + index[:, None] * s_i + dims[None, :] * s_d


@triton.jit
def _tile_bias(b, h, queries, rows, keys, cols, keys_ptr, num_keys, centres_ptr, sc_g, sc_b, sc_q, amp_ptr, sa_g,
               sa_b, sa_h, sa_q, inv_half_ptr, values_ptr, sv_b, sv_h, sv_q, sv_s, NUM_GRIDS: tl.constexpr,
               NUM_SEGMENTS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    """The ``[BLOCK_Q, BLOCK_K]`` bias tile, the window decay of each element (0 off every window) and the keys'
    grid and segment ids ``[BLOCK_K]``."""
    grid = tl.load(keys_ptr + keys, mask=cols, other=-1)
    plane = tl.load(keys_ptr + num_keys + keys, mask=cols, other=-1)
    y = tl.load(keys_ptr + 2 * num_keys + keys, mask=cols, other=0)
    x = tl.load(keys_ptr + 3 * num_keys + keys, mask=cols, other=0)
    segment = tl.load(keys_ptr + 4 * num_keys + keys, mask=cols, other=-1)
    bias = tl.zeros((BLOCK_Q, BLOCK_K), tl.float32)
    decay = tl.zeros((BLOCK_Q, BLOCK_K), tl.float32)
    for g in tl.static_range(NUM_GRIDS):
        centre = centres_ptr + g * sc_g + b * sc_b + queries * sc_q
        centre_plane = tl.load(centre, mask=rows, other=-1)
        dy = y[None, :] - tl.load(centre + 1, mask=rows, other=0)[:, None]
        dx = x[None, :] - tl.load(centre + 2, mask=rows, other=0)[:, None]
        distance = tl.sqrt((dy * dy + dx * dx).to(tl.float32))
        grid_decay = tl.maximum(1.0 - distance * tl.load(inv_half_ptr + g), 0.0)
        grid_decay = tl.where((grid == g)[None, :] & (plane[None, :] == centre_plane[:, None]), grid_decay, 0.0)
        amplitude = tl.load(amp_ptr + g * sa_g + b * sa_b + h * sa_h + queries * sa_q, mask=rows, other=0.0)
        decay += grid_decay
        bias += amplitude[:, None] * grid_decay
    for s in tl.static_range(NUM_SEGMENTS):
        value = tl.load(values_ptr + b * sv_b + h * sv_h + queries * sv_q + s * sv_s, mask=rows, other=0.0)
        bias += tl.where((segment == s)[None, :], value[:, None], 0.0)
    return bias, decay, grid, segment


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """``a @ b`` accumulated in float32; ``WIDEN``: the operands widened to float32 first (bfloat16 on Triton's
    interpreter, whose ``tl.dot`` misreads bfloat16 operands in Triton 3.7)."""
    if WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _scores(q, k, bias, keys, cols, b, pad_ptr, sp_b, scale, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
            WIDEN: tl.constexpr):
    """``q k^T * scale + bias`` with ``-inf`` at padded keys and keys past the end."""
    scores = _mm(q, tl.trans(k), PRECISION, WIDEN) * scale + bias
    live = cols
    if HAS_PADDING:
        live = live & (tl.load(pad_ptr + b * sp_b + keys, mask=cols, other=1) == 0)
    return tl.where(live[None, :], scores, float('-inf'))


@triton.jit
def _key_block(k_ptr, v_ptr, b, h, start, num_keys, dims, dim_mask, sk_b, sk_h, sk_k, sk_d, sv_b, sv_h, sv_k, sv_d,
               BLOCK_K: tl.constexpr):
    """The block of ``BLOCK_K`` keys from ``start``: their indices, which exist, and k and v ``[BLOCK_K, BLOCK_D]``."""
    keys = start + tl.arange(0, BLOCK_K)
    cols = keys < num_keys
    tile = cols[:, None] & dim_mask
    k = tl.load(_rows(k_ptr, b, h, keys, dims, sk_b, sk_h, sk_k, sk_d), mask=tile, other=0.0)
    v = tl.load(_rows(v_ptr, b, h, keys, dims, sv_b, sv_h, sv_k, sv_d), mask=tile, other=0.0)
    return keys, cols, k, v


@triton.jit
def _query_block(q_ptr, do_ptr, lse_ptr, delta_ptr, b, h, queries, rows, dims, block, sq_b, sq_h, sq_q, sq_d, sd_b,
                 sd_h, sd_q, sd_d, sl_b, sl_h):
    """What the backward needs of a block of queries: q and dO ``[BLOCK_Q, BLOCK_D]``, the log-sum-exp (+inf for
    an empty row, every key padded: its probabilities are then 0) and ``D = dO . out``."""
    q = tl.load(_rows(q_ptr, b, h, queries, dims, sq_b, sq_h, sq_q, sq_d), mask=block, other=0.0)
    do = tl.load(_rows(do_ptr, b, h, queries, dims, sd_b, sd_h, sd_q, sd_d), mask=block, other=0.0)
    lse = tl.load(lse_ptr + b * sl_b + h * sl_h + queries, mask=rows, other=float('inf'))
    lse = tl.where(lse == float('-inf'), float('inf'), lse)
    delta = tl.load(delta_ptr + b * sl_b + h * sl_h + queries, mask=rows, other=0.0)
    return q, do, lse, delta


@triton.jit
def _score_gradient(q, k, v, do, lse, delta, bias, keys, cols, b, pad_ptr, sp_b, scale, HAS_PADDING: tl.constexpr,
                    PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """The probabilities ``P`` of a tile, recomputed from the log-sum-exp, and the score gradient
    ``dS = P (dO v^T - D)``."""
    scores = _scores(q, k, bias, keys, cols, b, pad_ptr, sp_b, scale, HAS_PADDING, PRECISION, WIDEN)
    probs = tl.exp(scores - lse[:, None])
    return probs, probs * (_mm(do, tl.trans(v), PRECISION, WIDEN) - delta[:, None])


@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, keys_ptr, centres_ptr, amp_ptr, inv_half_ptr,
                    values_ptr, pad_ptr, heads, num_queries, num_keys, dim, scale, sq_b, sq_h, sq_q, sq_d, sk_b, sk_h,
                    sk_k, sk_d, sv_b, sv_h, sv_k, sv_d, so_b, so_h, so_q, so_d, sl_b, sl_h, sc_g, sc_b, sc_q, sa_g,
                    sa_b, sa_h, sa_q, sg_b, sg_h, sg_q, sg_s, sp_b, NUM_GRIDS: tl.constexpr,
                    NUM_SEGMENTS: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    b, h, queries, dims, rows = query_block_program(heads, num_queries, BLOCK_Q, BLOCK_D)
    dim_mask = (dims < dim)[None, :]
    q = tl.load(_rows(q_ptr, b, h, queries, dims, sq_b, sq_h, sq_q, sq_d), mask=rows[:, None] & dim_mask, other=0.0)
    row_max = tl.full((BLOCK_Q, ), float('-inf'), tl.float32)
    total = tl.zeros((BLOCK_Q, ), tl.float32)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), tl.float32)
    for start in range(0, num_keys, BLOCK_K):
        keys, cols, k, v = _key_block(k_ptr, v_ptr, b, h, start, num_keys, dims, dim_mask, sk_b, sk_h, sk_k, sk_d,
                                      sv_b, sv_h, sv_k, sv_d, BLOCK_K)
        bias, _, _, _ = _tile_bias(b, h, queries, rows, keys, cols, keys_ptr, num_keys, centres_ptr, sc_g, sc_b, sc_q,
                                   amp_ptr, sa_g, sa_b, sa_h, sa_q, inv_half_ptr, values_ptr, sg_b, sg_h, sg_q, sg_s,
                                   NUM_GRIDS, NUM_SEGMENTS, BLOCK_Q, BLOCK_K)
        scores = _scores(q, k, bias, keys, cols, b, pad_ptr, sp_b, scale, HAS_PADDING, PRECISION, WIDEN)
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        shift = tl.where(new_max == float('-inf'), 0.0, new_max)
        rescale = tl.exp(row_max - shift)
        probs = tl.exp(scores - shift[:, None])
        total = total * rescale + tl.sum(probs, 1)
        acc = acc * rescale[:, None] + _mm(probs.to(v.dtype), v, PRECISION, WIDEN)
        row_max = new_max
    live = total > 0.0
    out = acc / tl.where(live, total, 1.0)[:, None]
    tl.store(_rows(out_ptr, b, h, queries, dims, so_b, so_h, so_q, so_d), out, mask=rows[:, None] & dim_mask)
    lse = tl.where(live, row_max + tl.log(tl.where(live, total, 1.0)), float('-inf'))
    tl.store(lse_ptr + b * sl_b + h * sl_h + queries, lse, mask=rows)


@triton.jit
def _key_grad_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, keys_ptr, centres_ptr, amp_ptr,
                     inv_half_ptr, values_ptr, pad_ptr, heads, num_queries, num_keys, dim, scale, sq_b, sq_h, sq_q,
                     sq_d, sk_b, sk_h, sk_k, sk_d, sv_b, sv_h, sv_k, sv_d, sd_b, sd_h, sd_q, sd_d, sl_b, sl_h, sg_b,
                     sg_h, sg_k, sg_d, sc_g, sc_b, sc_q, sa_g, sa_b, sa_h, sa_q, sb_b, sb_h, sb_q, sb_s, sp_b,
                     NUM_GRIDS: tl.constexpr, NUM_SEGMENTS: tl.constexpr, HAS_PADDING: tl.constexpr,
                     PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """``dk``, ``dv`` of one block of keys (float32, written to ``dk_ptr`` / ``dv_ptr`` with strides ``sg_*``)."""
    table = tl.program_id(0)
    b, h = table // heads, table % heads
    dims = tl.arange(0, BLOCK_D)
    dim_mask = (dims < dim)[None, :]
    keys, cols, k, v = _key_block(k_ptr, v_ptr, b, h, tl.program_id(1) * BLOCK_K, num_keys, dims, dim_mask, sk_b, sk_h,
                                  sk_k, sk_d, sv_b, sv_h, sv_k, sv_d, BLOCK_K)
    dk = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_K, BLOCK_D), tl.float32)
    for start in range(0, num_queries, BLOCK_Q):
        queries = start + tl.arange(0, BLOCK_Q)
        rows = queries < num_queries
        block = rows[:, None] & dim_mask
        q, do, lse, delta = _query_block(q_ptr, do_ptr, lse_ptr, delta_ptr, b, h, queries, rows, dims, block, sq_b,
                                         sq_h, sq_q, sq_d, sd_b, sd_h, sd_q, sd_d, sl_b, sl_h)
        bias, _, _, _ = _tile_bias(b, h, queries, rows, keys, cols, keys_ptr, num_keys, centres_ptr, sc_g, sc_b, sc_q,
                                   amp_ptr, sa_g, sa_b, sa_h, sa_q, inv_half_ptr, values_ptr, sb_b, sb_h, sb_q, sb_s,
                                   NUM_GRIDS, NUM_SEGMENTS, BLOCK_Q, BLOCK_K)
        probs, d_scores = _score_gradient(q, k, v, do, lse, delta, bias, keys, cols, b, pad_ptr, sp_b, scale,
                                          HAS_PADDING, PRECISION, WIDEN)
        dv += _mm(tl.trans(probs.to(do.dtype)), do, PRECISION, WIDEN)
        dk += _mm(tl.trans(d_scores.to(q.dtype)), q, PRECISION, WIDEN)
    tile = cols[:, None] & dim_mask
    tl.store(_rows(dk_ptr, b, h, keys, dims, sg_b, sg_h, sg_k, sg_d), dk * scale, mask=tile)
    tl.store(_rows(dv_ptr, b, h, keys, dims, sg_b, sg_h, sg_k, sg_d), dv, mask=tile)


@triton.jit
def _query_grad_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, dterms_ptr, keys_ptr, centres_ptr,
                       amp_ptr, inv_half_ptr, values_ptr, pad_ptr, heads, num_queries, num_keys, dim, scale, sq_b,
                       sq_h, sq_q, sq_d, sk_b, sk_h, sk_k, sk_d, sv_b, sv_h, sv_k, sv_d, sd_b, sd_h, sd_q, sd_d, sl_b,
                       sl_h, sr_b, sr_h, sr_q, sr_d, st_b, st_h, st_q, st_t, sc_g, sc_b, sc_q, sa_g, sa_b, sa_h, sa_q,
                       sb_b, sb_h, sb_q, sb_s, sp_b, NUM_GRIDS: tl.constexpr, NUM_SEGMENTS: tl.constexpr,
                       HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr, BLOCK_Q: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr):
    """``dq`` of one block of queries (float32, strides ``sr_*``) and the gradients of its bias terms
    ``[BLOCK_Q, NUM_GRIDS + NUM_SEGMENTS]`` (amplitude per grid, then value per segment; strides ``st_*``)."""
    b, h, queries, dims, rows = query_block_program(heads, num_queries, BLOCK_Q, BLOCK_D)
    terms = tl.arange(0, BLOCK_T)
    dim_mask = (dims < dim)[None, :]
    block = rows[:, None] & dim_mask
    q, do, lse, delta = _query_block(q_ptr, do_ptr, lse_ptr, delta_ptr, b, h, queries, rows, dims, block, sq_b, sq_h,
                                     sq_q, sq_d, sd_b, sd_h, sd_q, sd_d, sl_b, sl_h)
    dq = tl.zeros((BLOCK_Q, BLOCK_D), tl.float32)
    d_terms = tl.zeros((BLOCK_Q, BLOCK_T), tl.float32)
    for start in range(0, num_keys, BLOCK_K):
        keys, cols, k, v = _key_block(k_ptr, v_ptr, b, h, start, num_keys, dims, dim_mask, sk_b, sk_h, sk_k, sk_d,
                                      sv_b, sv_h, sv_k, sv_d, BLOCK_K)
        bias, decay, grid, segment = _tile_bias(b, h, queries, rows, keys, cols, keys_ptr, num_keys, centres_ptr,
                                                sc_g, sc_b, sc_q, amp_ptr, sa_g, sa_b, sa_h, sa_q, inv_half_ptr,
                                                values_ptr, sb_b, sb_h, sb_q, sb_s, NUM_GRIDS, NUM_SEGMENTS, BLOCK_Q,
                                                BLOCK_K)
        _, d_scores = _score_gradient(q, k, v, do, lse, delta, bias, keys, cols, b, pad_ptr, sp_b, scale,
                                      HAS_PADDING, PRECISION, WIDEN)
        dq += _mm(d_scores.to(k.dtype), k, PRECISION, WIDEN)
        weighted = d_scores * decay
        for g in tl.static_range(NUM_GRIDS):
            d_amp = tl.sum(tl.where((grid == g)[None, :], weighted, 0.0), 1)
            d_terms += tl.where((terms == g)[None, :], d_amp[:, None], 0.0)
        for s in tl.static_range(NUM_SEGMENTS):
            d_value = tl.sum(tl.where((segment == s)[None, :], d_scores, 0.0), 1)
            d_terms += tl.where((terms == NUM_GRIDS + s)[None, :], d_value[:, None], 0.0)
    tl.store(_rows(dq_ptr, b, h, queries, dims, sr_b, sr_h, sr_q, sr_d), dq * scale, mask=block)
    if NUM_GRIDS + NUM_SEGMENTS > 0:
        tl.store(dterms_ptr + b * st_b + h * st_h + queries[:, None] * st_q + terms[None, :] * st_t, d_terms,
                 mask=rows[:, None] & (terms < NUM_GRIDS + NUM_SEGMENTS)[None, :])


def _precision(dtype: torch.dtype, device: torch.device) -> str:
    """``tl.dot``'s input precision: ``'tf32x3'`` for float32 on a GPU, ``'ieee'`` on the interpreter (which
    multiplies in float32 whatever it is told) and for half-precision inputs (for which it changes nothing)."""
    return 'tf32x3' if dtype == torch.float32 and device.type == 'cuda' else 'ieee'


def block_d(dim: int) -> int:
    """``BLOCK_D``: the head dim rounded up to a power of two of at least 16 (``tl.dot``'s smallest operand side)."""
    return max(16, triton.next_power_of_2(dim))


def block_t(num_terms: int) -> int:
    """``BLOCK_T`` of the ``dq`` kernel: the bias terms (grids + segments) as a power of two, at least 2."""
    return max(2, triton.next_power_of_2(num_terms))


def _bias_args(tables: TileBiasTables, amplitude: Tensor, values: Tensor) -> tuple:
    """The bias's pointers, in every kernel's order (``keys``, ``centres``, ``amp``, ``inv_half``, ``values``,
    ``pad``; without padding ``pad`` points at ``keys`` and is never read)."""
    return (tables.keys, tables.centres, amplitude, tables.inv_half, values,
            tables.padding if tables.padding is not None else tables.keys)


def _bias_strides(tables: TileBiasTables, amplitude: Tensor, values: Tensor) -> tuple:
    """The bias's strides, in every kernel's order (``sc_*``, ``sa_*``, values', ``sp_b``)."""
    padding = tables.padding if tables.padding is not None else tables.keys
    return (*tables.centres.stride()[:3], *amplitude.stride(), *values.stride(), padding.stride(0))


def _constants(kernel: str, tables: TileBiasTables, q: Tensor) -> dict:
    """The compile-time constants and launch options of ``kernel`` in a call."""
    launch = launch_of(kernel, q.dtype)
    options = dict(num_warps=launch.num_warps, num_stages=NUM_STAGES) if q.device.type == 'cuda' else {}
    return dict(NUM_GRIDS=tables.num_grids, NUM_SEGMENTS=tables.num_segments, HAS_PADDING=tables.padding is not None,
                PRECISION=_precision(q.dtype, q.device), WIDEN=q.dtype == torch.bfloat16 and q.device.type != 'cuda',
                BLOCK_Q=launch.block_q, BLOCK_K=launch.block_k, BLOCK_D=block_d(q.size(-1)), **options)


def tiled_bias_forward(q: Tensor, k: Tensor, v: Tensor, tables: TileBiasTables, amplitude: Tensor, values: Tensor,
                       scale: float) -> Tuple[Tensor, Tensor]:
    """Biased attention and its log-sum-exp.

    Args:
        q (Tensor): ``[bs, heads, Q, d]`` (any strides).
        k, v (Tensor): ``[bs, heads, K, d]``.
        tables (TileBiasTables): the keys' cells and the queries' centres.
        amplitude (Tensor): ``[G, bs, heads | 1 (stride 0), Q]`` float32 window amplitudes.
        values (Tensor): ``[bs, heads | 1 (stride 0), Q, S]`` float32 segment values.
        scale (float): multiplier of ``q k^T``.

    Returns:
        tuple[Tensor, Tensor]: the output ``[bs, heads, Q, d]`` in float32
        (0 for a query whose keys are all padded; the backward's row term
        ``D = dO . out`` is taken from it unrounded: the segment values'
        gradients are sums of ``P (dP - D)`` over thousands of keys that
        cancel, and a half-precision output's rounding in ``D`` would remain)
        and the float32 log-sum-exp ``[bs, heads, Q]`` (``-inf`` there).
    """
    bs, heads, num_queries, dim = q.shape
    num_keys = k.size(2)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((bs, heads, num_queries), dtype=torch.float32, device=q.device)
    grid = (bs * heads, triton.cdiv(num_queries, launch_of('forward', q.dtype).block_q))
    _forward_kernel[grid](q, k, v, out, lse, *_bias_args(tables, amplitude, values), heads, num_queries, num_keys,
                          dim, float(scale), *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride()[:2],
                          *_bias_strides(tables, amplitude, values), **_constants('forward', tables, q))
    return out, lse


def tiled_bias_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        tables: TileBiasTables, amplitude: Tensor, values: Tensor,
                        scale: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of :func:`tiled_bias_forward`'s output (``out``: its float32 output).

    Returns:
        tuple: float32 ``dq`` ``[bs, heads, Q, d]``, ``dk``, ``dv``
        ``[bs, heads, K, d]`` and the bias terms' gradients
        ``[bs, heads, Q, G + S]`` (per grid the amplitude's, then per segment
        the value's, per head).
    """
    bs, heads, num_queries, dim = q.shape
    num_keys = k.size(2)
    delta = (grad_out.float() * out).sum(-1)
    dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.empty(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.empty(k.shape, dtype=torch.float32, device=q.device)
    num_terms = tables.num_grids + tables.num_segments
    d_terms = torch.empty((bs, heads, num_queries, num_terms), dtype=torch.float32, device=q.device)
    shared = (*_bias_args(tables, amplitude, values), heads, num_queries, num_keys, dim, float(scale), *q.stride(),
              *k.stride(), *v.stride(), *grad_out.stride(), *lse.stride()[:2])
    _key_grad_kernel[(bs * heads, triton.cdiv(num_keys, launch_of('key_grad', q.dtype).block_k))](
        q, k, v, grad_out, lse, delta, dk, dv, *shared, *dk.stride(),
        *_bias_strides(tables, amplitude, values), **_constants('key_grad', tables, q))
    _query_grad_kernel[(bs * heads, triton.cdiv(num_queries, launch_of('query_grad', q.dtype).block_q))](
        q, k, v, grad_out, lse, delta, dq, d_terms, *shared, *dq.stride(), *d_terms.stride(),
        *_bias_strides(tables, amplitude, values), BLOCK_T=block_t(num_terms),
        **_constants('query_grad', tables, q))
    return dq, dk, dv, d_terms
