"""Bias-free fused attention that also returns the log-sum-exp of its scores, and its backward.

The ``segment`` backend runs this once per key segment and merges the
partial outputs with their log-sum-exps. It calls PyTorch's own SDPA kernels
through their aten ops, which return the log-sum-exp that
``F.scaled_dot_product_attention`` hides:

* CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``),
  any float dtype, with an optional additive key mask;
* CUDA float16 / bfloat16: ``aten._scaled_dot_product_flash_attention``
  (+ ``_backward``);
* CUDA float32: ``aten._scaled_dot_product_efficient_attention`` with
  ``compute_log_sumexp=True`` (+ ``_backward``); its log-sum-exp is padded to
  a multiple of 32 queries and is cut back to ``Q`` here.

On CUDA the head dim must be a multiple of 8 up to 256 and no mask is applied.
Inputs are ``[bs, heads, L, d]``; the log-sum-exp is float32 ``[bs, heads, Q]``.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

CUDA_MAX_HEAD_DIM = 256


def fused_lse_not_supported_reasons(device_type: str, dtype: torch.dtype, head_dim: int,
                                    has_key_mask: bool) -> List[str]:
    """Why the fused kernel cannot run on this device / dtype / head dim (empty when it can)."""
    if device_type == 'cpu':
        return []
    if device_type != 'cuda':
        return [f'no fused attention kernel with log-sum-exp for device {device_type}']
    reasons = []
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        reasons.append(f'the CUDA fused kernels need float16, bfloat16 or float32 inputs, got {dtype}')
    if head_dim % 8 or head_dim > CUDA_MAX_HEAD_DIM:
        reasons.append(f'the CUDA flash kernel needs a head dim that is a multiple of 8 and <= {CUDA_MAX_HEAD_DIM}, '
                       f'got {head_dim}')
    if has_key_mask:
        reasons.append('the CUDA flash kernel applies no key padding mask')
    return reasons


def fused_attention_with_lse(q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor],
                             scale: float) -> Tuple[Tensor, Tensor, tuple]:
    """Bias-free attention with its log-sum-exp.

    Args:
        q (Tensor): ``[bs, heads, Q, d]``.
        k (Tensor): ``[bs, heads, K, d]``.
        v (Tensor): ``[bs, heads, K, d]``.
        key_mask (Tensor, optional): ``[bs, 1, 1, K]`` additive (0 / -inf) in
            q's dtype (CPU only).
        scale (float): multiplier of ``q k^T``.

    Returns:
        tuple: ``out`` ``[bs, heads, Q, d]``, ``lse`` float32 ``[bs, heads, Q]``
        (of the scaled scores; meaningless for rows with every key masked),
        and the state :func:`fused_attention_with_lse_backward` needs.
    """
    if q.device.type == 'cpu':
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=key_mask, scale=scale)
        return out, lse.float(), (lse, )
    if q.dtype == torch.float32:
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, False, scale=scale)
        return out, lse[..., :q.size(2)], (lse, seed, offset)
    out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, _ = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, False, False, scale=scale)
    return out, lse.float(), (lse, cum_q, cum_k, max_q, max_k, rng_state, unused)


def fused_attention_with_lse_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, state: tuple,
                                      key_mask: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`fused_attention_with_lse`'s output w.r.t. q, k, v.

    ``out`` enters only through ``D = rowsum(grad_out * out)``; passing a
    different ``out`` (the merged output of several segments) changes ``D``
    accordingly, which is what the segment merge needs.

    Returns:
        tuple[Tensor, Tensor, Tensor]: ``dq``, ``dk``, ``dv`` in the inputs' dtype.
    """
    grad_out = grad_out.contiguous()
    if q.device.type == 'cpu':
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, state[0], 0.0, False, attn_mask=key_mask, scale=scale)
    if q.dtype == torch.float32:
        lse, seed, offset = state
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], False, scale=scale)
        return dq, dk, dv
    lse, cum_q, cum_k, max_q, max_k, rng_state, unused = state
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        grad_out, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, False, rng_state, unused, scale=scale)
