"""Triton kernels of the three slot products of :class:`~.window_slots.SlotPattern` (its ``'triton'`` formulation).

One program per (sample, head, block of ``BLOCK_Q`` queries) loops over the
slots (for ``dot`` and ``scatter_add_``, whose slots are independent, over one
group of ``SLOTS_PER_PROGRAM`` of them, for more programs): it loads each
slot's key index, then the ``[BLOCK_Q, d]`` rows of the key table the indices
name, straight from the table's own strides and dtype, and reduces them in
float32 registers: no gathered ``[Q, L, d]`` block is written, no table is
copied, every shape is a function of the call's shapes:

* :func:`slot_dot`: ``out[q, j] = scale * a[q] . x[index[q, j]]``;
* :func:`slot_weighted_sum`: ``out[q] = sum_j w[q, j] x[index[q, j]]`` (a
  slot whose ``valid`` is False adds nothing, whatever its weight);
* :func:`slot_scatter_add_`: ``target[index[q, j]] += alpha * w[q, j] a[q]``
  with one atomic add per live slot row; invalid slots and slots whose weight
  is exactly 0 are skipped (masked), so no key gathers the no-op adds of the
  invalid slots.

This module imports Triton (:mod:`.window_slots` imports it only when the
``'triton'`` formulation runs). The kernels run on CUDA tensors, and on CPU
tensors under ``TRITON_INTERPRET=1`` (set before import), how the CPU tests
check them against the other formulations. ``atomic_add`` makes the order of
:func:`slot_scatter_add_`'s additions vary from run to run on a GPU (last-bit
differences; ``torch.use_deterministic_algorithms`` does not cover Triton).
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..triton_blocks import query_block_program

#: queries per program
BLOCK_Q = 32
#: slots per program of ``dot`` and ``scatter_add_`` (the grid's third axis covers the rest)
SLOTS_PER_PROGRAM = 64


@triton.jit
def _dot_kernel(a_ptr, x_ptr, index_ptr, out_ptr, heads, num_queries, length, dim, scale,
                sa_b, sa_h, sa_q, sa_d, sx_b, sx_h, sx_k, sx_d, si_b, si_q, si_l, so_b, so_h, so_q, so_l,
                SLOTS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    b, h, queries, dims, rows = query_block_program(heads, num_queries, BLOCK_Q, BLOCK_D)
    cells = rows[:, None] & (dims < dim)[None, :]
    a = tl.load(a_ptr + b * sa_b + h * sa_h + queries[:, None] * sa_q + dims[None, :] * sa_d, mask=cells,
                other=0.0).to(tl.float32)
    first = tl.program_id(2) * SLOTS
    for j in range(first, tl.minimum(first + SLOTS, length)):
        key = tl.load(index_ptr + b * si_b + queries * si_q + j * si_l, mask=rows, other=0).to(tl.int64)
        x = tl.load(x_ptr + b * sx_b + h * sx_h + key[:, None] * sx_k + dims[None, :] * sx_d, mask=cells,
                    other=0.0).to(tl.float32)
        tl.store(out_ptr + b * so_b + h * so_h + queries * so_q + j * so_l, tl.sum(a * x, 1) * scale, mask=rows)


@triton.jit
def _weighted_sum_kernel(w_ptr, x_ptr, index_ptr, valid_ptr, out_ptr, heads, num_queries, length, dim,
                         sw_b, sw_h, sw_q, sw_l, sx_b, sx_h, sx_k, sx_d, si_b, si_q, si_l, sv_b, sv_q, sv_l,
                         so_b, so_h, so_q, so_d, HAS_VALID: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    b, h, queries, dims, rows = query_block_program(heads, num_queries, BLOCK_Q, BLOCK_D)
    acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=tl.float32)
    for j in range(length):
        slot = b * si_b + queries * si_q + j * si_l
        live = rows
        if HAS_VALID:
            live = live & (tl.load(valid_ptr + b * sv_b + queries * sv_q + j * sv_l, mask=rows, other=0) != 0)
        key = tl.load(index_ptr + slot, mask=live, other=0).to(tl.int64)
        w = tl.load(w_ptr + b * sw_b + h * sw_h + queries * sw_q + j * sw_l, mask=live, other=0.0).to(tl.float32)
        cells = live[:, None] & (dims < dim)[None, :]
        x = tl.load(x_ptr + b * sx_b + h * sx_h + key[:, None] * sx_k + dims[None, :] * sx_d, mask=cells,
                    other=0.0).to(tl.float32)
        acc += w[:, None] * x
    tl.store(out_ptr + b * so_b + h * so_h + queries[:, None] * so_q + dims[None, :] * so_d, acc,
             mask=rows[:, None] & (dims < dim)[None, :])


@triton.jit
def _scatter_add_kernel(target_ptr, w_ptr, a_ptr, index_ptr, valid_ptr, heads, num_queries, length, dim, alpha,
                        st_b, st_h, st_k, st_d, sw_b, sw_h, sw_q, sw_l, sa_b, sa_h, sa_q, sa_d, si_b, si_q, si_l,
                        sv_b, sv_q, sv_l, HAS_VALID: tl.constexpr, SLOTS: tl.constexpr, BLOCK_Q: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    b, h, queries, dims, rows = query_block_program(heads, num_queries, BLOCK_Q, BLOCK_D)
    a = tl.load(a_ptr + b * sa_b + h * sa_h + queries[:, None] * sa_q + dims[None, :] * sa_d,
                mask=rows[:, None] & (dims < dim)[None, :], other=0.0).to(tl.float32) * alpha
    first = tl.program_id(2) * SLOTS
    for j in range(first, tl.minimum(first + SLOTS, length)):
        slot = b * si_b + queries * si_q + j * si_l
        live = rows
        if HAS_VALID:
            live = live & (tl.load(valid_ptr + b * sv_b + queries * sv_q + j * sv_l, mask=rows, other=0) != 0)
        w = tl.load(w_ptr + b * sw_b + h * sw_h + queries * sw_q + j * sw_l, mask=live, other=0.0).to(tl.float32)
        live = live & (w != 0.0)
        key = tl.load(index_ptr + slot, mask=live, other=0).to(tl.int64)
        tl.atomic_add(target_ptr + b * st_b + h * st_h + key[:, None] * st_k + dims[None, :] * st_d,
                      w[:, None] * a, mask=live[:, None] & (dims < dim)[None, :])


def _grid(bs: int, heads: int, num_queries: int, length: int = SLOTS_PER_PROGRAM) -> tuple:
    """(sample x head, query block, slot group); one slot group unless ``length`` is given."""
    return (bs * heads, triton.cdiv(num_queries, BLOCK_Q), triton.cdiv(length, SLOTS_PER_PROGRAM))


def _block_d(dim: int) -> int:
    return triton.next_power_of_2(dim)


def slot_dot(index: Tensor, a: Tensor, x: Tensor, scale: float) -> Tensor:
    """``scale * a . x`` at the slots.

    Args:
        index (Tensor): ``[bs, Q, L]`` key index of every slot.
        a (Tensor): ``[bs, heads, Q, d]``.
        x (Tensor): ``[bs, heads, K, d]`` (any strides and float dtype).
        scale (float): multiplier.

    Returns:
        Tensor: ``[bs, heads, Q, L]`` float32.
    """
    bs, num_queries, length = index.shape
    heads, dim = a.size(1), a.size(-1)
    out = torch.empty((bs, heads, num_queries, length), dtype=torch.float32, device=a.device)
    _dot_kernel[_grid(bs, heads, num_queries, length)](
        a, x, index, out, heads, num_queries, length, dim, float(scale), *a.stride(), *x.stride(), *index.stride(),
        *out.stride(), SLOTS=SLOTS_PER_PROGRAM, BLOCK_Q=BLOCK_Q, BLOCK_D=_block_d(dim))
    return out


def slot_weighted_sum(index: Tensor, valid: Optional[Tensor], weights: Tensor, x: Tensor) -> Tensor:
    """``sum_j weights[..., q, j] x[..., index[q, j], :]`` over the valid slots.

    Args:
        index (Tensor): ``[bs, Q, L]``.
        valid (Tensor, optional): ``[bs, Q, L]`` uint8, 0 for a dead slot; None: every slot counts.
        weights (Tensor): ``[bs, heads, Q, L]`` (any strides, e.g. expanded over heads).
        x (Tensor): ``[bs, heads, K, d]``.

    Returns:
        Tensor: ``[bs, heads, Q, d]`` float32.
    """
    bs, num_queries, length = index.shape
    heads, dim = weights.size(1), x.size(-1)
    out = torch.empty((bs, heads, num_queries, dim), dtype=torch.float32, device=x.device)
    valid_bytes = _valid_bytes(valid, index)
    _weighted_sum_kernel[_grid(bs, heads, num_queries)](
        weights, x, index, valid_bytes, out, heads, num_queries, length, dim, *weights.stride(), *x.stride(),
        *index.stride(), *valid_bytes.stride(), *out.stride(), HAS_VALID=valid is not None, BLOCK_Q=BLOCK_Q,
        BLOCK_D=_block_d(dim))
    return out


def slot_scatter_add_(index: Tensor, valid: Optional[Tensor], target: Tensor, weights: Tensor, a: Tensor,
                      alpha: float) -> None:
    """``target[..., k, :] += alpha * sum_{q, j: index[q, j] = k} weights[..., q, j] a[..., q, :]`` (live slots).

    Args:
        index (Tensor): ``[bs, Q, L]``.
        valid (Tensor, optional): ``[bs, Q, L]`` uint8, 0 for a dead slot; None: every slot counts.
        target (Tensor): ``[bs, heads, K, d]`` float32, updated in place (any strides).
        weights (Tensor): ``[bs, heads, Q, L]``.
        a (Tensor): ``[bs, heads, Q, d]``.
        alpha (float): multiplier.
    """
    if target.dtype != torch.float32:
        raise TypeError(f'slot_scatter_add_ adds into a float32 target, got {target.dtype}')
    bs, num_queries, length = index.shape
    heads, dim = a.size(1), a.size(-1)
    valid_bytes = _valid_bytes(valid, index)
    _scatter_add_kernel[_grid(bs, heads, num_queries, length)](
        target, weights, a, index, valid_bytes, heads, num_queries, length, dim, float(alpha), *target.stride(),
        *weights.stride(), *a.stride(), *index.stride(), *valid_bytes.stride(), HAS_VALID=valid is not None,
        SLOTS=SLOTS_PER_PROGRAM, BLOCK_Q=BLOCK_Q, BLOCK_D=_block_d(dim))


def _valid_bytes(valid: Optional[Tensor], index: Tensor) -> Tensor:
    """The pointer the kernels load the validity from: ``valid`` (uint8), or ``index`` itself when None (the
    kernels then never read it)."""
    if valid is None:
        return index
    if valid.shape != index.shape or valid.dtype != torch.uint8:
        raise ValueError(f'valid must be uint8 of the shape of index {tuple(index.shape)}, got {valid.dtype} '
                         f'{tuple(valid.shape)}')
    return valid
