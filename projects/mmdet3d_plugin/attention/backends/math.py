"""``math``: the reference, ``softmax(q k^T * scale + B) v`` with the dense bias, in fp32 (fp64 for fp64 inputs).

Materialises the ``[bs, heads, Q, K]`` scores: for tests, small inputs and as
the numerical yardstick of every other backend. Applies anything (dense or
structured bias, key padding, dropout). A query whose keys are all blocked
gets a zero output and zero gradients (no NaN).
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import AttentionBackend, AttentionCall, dense_additive_bias


def reference_probabilities(q: Tensor, k: Tensor, bias: Optional[Tensor], scale: float) -> Tensor:
    """The attention probabilities ``softmax(q k^T * scale + bias)`` with a safe softmax, in fp32 (fp64 for fp64 ``q``).

    Args:
        q (Tensor): ``[bs, heads, Q, d]``.
        k (Tensor): ``[bs, heads, K, d]``.
        bias (Tensor, optional): additive, broadcastable to ``[bs, heads, Q, K]`` (``-inf`` blocks a key).
        scale (float): multiplier of ``q k^T``.

    Returns:
        Tensor: ``[bs, heads, Q, K]``; rows with every key blocked are 0.
    """
    dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):
        scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * scale
        if bias is not None:
            scores = scores + bias.to(dtype)
        row_max = scores.detach().amax(-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
        weights = torch.exp(scores - row_max)
        total = weights.sum(-1, keepdim=True)
        return weights / torch.where(total > 0, total, 1.0)


def reference_attention(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor], scale: float,
                        dropout_p: float = 0.0) -> Tensor:
    """Attention in fp32 (in fp64 when ``q`` is fp64: the yardstick of ``tools/check_gpu.py``) with a safe softmax.

    Args:
        q (Tensor): ``[bs, heads, Q, d]``.
        k (Tensor): ``[bs, heads, K, d]``.
        v (Tensor): ``[bs, heads, K, d]``.
        bias (Tensor, optional): additive, broadcastable to ``[bs, heads, Q, K]``
            (``-inf`` blocks a key).
        scale (float): multiplier of ``q k^T``.
        dropout_p (float): dropout on the probabilities.

    Returns:
        Tensor: ``[bs, heads, Q, d]`` float32, or float64 for float64 ``q`` (also
        under autocast); 0 for rows with every key blocked.
    """
    probs = reference_probabilities(q, k, bias, scale)
    with torch.autocast(q.device.type, enabled=False):
        if dropout_p > 0:
            probs = F.dropout(probs, p=dropout_p)
        return torch.matmul(probs, v.to(probs.dtype))


class MathBackend(AttentionBackend):
    """The reference backend (fp32, fp64 for fp64 inputs); runs every call."""

    name = 'math'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        return []

    def forward(self, call: AttentionCall) -> Tensor:
        bias = dense_additive_bias(call.bias, call.key_padding_mask, torch.promote_types(call.q.dtype, torch.float32))
        out = reference_attention(call.q, call.k, call.v, bias, call.scale, call.dropout_p)
        return out.to(call.q.dtype)
