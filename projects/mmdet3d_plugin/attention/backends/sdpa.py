"""``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` with a dense mask.

A structured bias is materialised with ``to_dense`` (a ``[bs, heads | 1, Q, K]``
tensor in q's dtype): exact, but memory and time grow with ``Q * K``. Pure
masks (bool biases, key padding) stay bool and broadcast, so a key padding
mask alone costs ``O(bs * K)``. Rows whose keys are all blocked are unblocked
for the kernel and zeroed afterwards, so no kernel ever sees an empty row
(some return NaN for it). Runs every call, including dropout.
"""
from typing import List

import torch.nn.functional as F
from torch import Tensor

from .base import AttentionBackend, AttentionCall, dense_additive_bias, dense_blocking_mask


class SdpaBackend(AttentionBackend):
    """PyTorch's fused SDPA with the bias as a dense mask."""

    name = 'sdpa'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
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
        out = F.scaled_dot_product_attention(call.q, call.k, call.v, attn_mask=attn_mask, dropout_p=call.dropout_p,
                                             scale=call.scale)
        return out if empty_rows is None else out.masked_fill(empty_rows, 0.0)
