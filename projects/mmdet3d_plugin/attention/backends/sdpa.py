"""``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with a dense mask.

A structured bias is materialised with ``to_dense`` (a ``[bs, heads | 1, Q, K]``
tensor in q's dtype): exact, but memory and time grow with ``Q * K``. Pure
masks (bool biases, key padding) stay bool and broadcast, so a key padding
mask alone costs ``O(bs * K)``. Rows whose keys are all blocked are unblocked
for the kernel and zeroed afterwards, so no kernel ever sees an empty row
(some return NaN for it). Runs every call, including dropout, except one: a
:class:`~..bias.SegmentBias` whose values need a gradient, in float16 or
bfloat16. That gradient is the sum, over the segment's keys, of the dense
mask's gradient, which SDPA returns rounded to q's dtype; the sum cancels
(each row of a softmax gradient sums to 0, so one segment's gradient is minus
the other's) and the rounding errors of thousands of keys remain, a large
relative error at the R50 and VoV key counts (``tools/check_gpu.py`` shows
it). ``segment`` and ``flashbias`` differentiate it exactly; ``auto`` takes them.

A call where only the bias needs a gradient (the ``alpha`` of
``AttentionBiasGenerator`` with frozen projections, the router-only stage 2
of the robustness study) gives the kernel a query that requires grad
(:func:`kernel_query`): PyTorch's memory-efficient CUDA kernel decides from
q, k and v alone whether its forward keeps the logsumexp, and without it
the backward of the mask fails (``LSE is not correctly aligned (strideH)``,
pytorch/pytorch#148476). The query's own gradient is
computed and dropped; the forward and the bias gradient are unchanged.
"""
from typing import List

import torch
import torch.nn.functional as F
from torch import Tensor

from ..bias import SegmentBias
from .base import AttentionBackend, AttentionCall, dense_additive_bias, dense_blocking_mask

#: dtypes in which a dense mask's gradient is too coarse to sum into a segment bias's gradient
LOW_PRECISION = (torch.float16, torch.bfloat16)


class SdpaBackend(AttentionBackend):
    """PyTorch's fused SDPA with the bias as a dense mask."""

    name = 'sdpa'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        if call.q.dtype in LOW_PRECISION and torch.is_grad_enabled() and call.bias is not None and any(
                isinstance(part, SegmentBias) and part.values.requires_grad for part in call.bias.parts):
            return [f'the gradient of a SegmentBias summed from a dense {call.q.dtype} mask gradient is inexact '
                    '(use segment or flashbias)']
        return []

    def forward(self, call: AttentionCall) -> Tensor:
        blocked = dense_blocking_mask(call)
        if blocked is not None:
            empty_rows = blocked.all(-1, keepdim=True)
            attn_mask = ~(blocked & ~empty_rows)
        else:
            attn_mask = dense_additive_bias(call.bias, call.key_padding_mask, call.q.dtype)
            empty_rows = None
            if attn_mask is not None:
                empty_rows = attn_mask.isneginf().all(-1, keepdim=True)
                attn_mask = attn_mask.masked_fill(empty_rows, 0.0)
        out = F.scaled_dot_product_attention(kernel_query(call), call.k, call.v, attn_mask=attn_mask,
                                             dropout_p=call.dropout_p, scale=call.scale)
        return out if empty_rows is None else out.masked_fill(empty_rows, 0.0)


def kernel_query(call: AttentionCall) -> Tensor:
    """The query SDPA gets: ``call.q``, or a detached copy that requires grad when only the bias needs a gradient.

    Whether a fused kernel's forward keeps the logsumexp its backward needs
    depends on whether q, k or v require grad; a bias-only gradient would
    otherwise reach a backward without it (the module docstring).
    """
    if call.needs_grad and not call.qkv_need_grad:
        return call.q.detach().requires_grad_(True)
    return call.q
