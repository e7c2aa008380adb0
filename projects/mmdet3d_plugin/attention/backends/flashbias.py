"""``flashbias``: a low-rank bias folded into the dot product (the FlashBias idea, Wu et al., NeurIPS 2025).

``scale * q k^T + U V^T = [q * scale, U] [k, V]^T``, so SDPA on the widened
``q' = [q * scale, U]`` and ``k' = [k, V]`` with scale 1 applies the bias
exactly, in any fused kernel, with no ``[Q, K]`` tensor. Head dims are padded
with zeros to a multiple of 8, and ``v`` is padded to the same width (CPU SDPA
takes its slow path when q/k and v head dims differ); the output is sliced
back. Applies :class:`SegmentBias` (through its one-hot low-rank form) and
:class:`LowRankBias`; a key padding mask goes to SDPA as a broadcast bool
mask; dropout is SDPA's. Gradients reach q, k, v and both factors through
autograd.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..bias import LowRankBias, SegmentBias
from .base import AttentionBackend, AttentionCall, empty_sample_mask

HEAD_DIM_MULTIPLE = 8


def low_rank_factors(call: AttentionCall) -> Optional[Tuple[Tensor, Tensor]]:
    """Concatenate the low-rank factors of every bias part.

    Returns:
        tuple[Tensor, Tensor] | None: ``U`` ``[bs, heads, Q, r]`` and ``V``
        ``[bs, heads, K, r]`` (expanded views where shared), or None without bias.
    """
    if call.bias is None:
        return None
    bs, heads, num_queries, _ = call.q.shape
    query_factors, key_factors = [], []
    for part in call.bias.parts:
        low_rank = part.to_low_rank()
        query_factors.append(low_rank.query_factor.expand(bs, heads, num_queries, -1))
        key_factors.append(low_rank.key_factor[:, None].expand(bs, heads, -1, -1))
    return torch.cat(query_factors, -1), torch.cat(key_factors, -1)


def _widen(pieces: List[Tensor], width: int) -> Tensor:
    """Concatenate ``pieces`` on the last dim and zero-pad to ``width``, in one copy."""
    missing = width - sum(p.size(-1) for p in pieces)
    if missing:
        first = pieces[0]
        pieces = pieces + [first.new_zeros((1, ) * first.dim()).expand(*first.shape[:-1], missing)]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, -1)


class FlashBiasBackend(AttentionBackend):
    """SDPA on ``[q * scale, U]`` and ``[k, V]``: exact low-rank bias without a ``[Q, K]`` tensor."""

    name = 'flashbias'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        foreign = call.foreign_parts((SegmentBias, LowRankBias))
        if foreign:
            return [f'flashbias applies only low-rank biases (SegmentBias, LowRankBias), not {", ".join(foreign)}']
        return []

    def forward(self, call: AttentionCall) -> Tensor:
        q, k, v = [call.q], [call.k], [call.v]
        factors = low_rank_factors(call)
        if factors is not None:
            query_factor, key_factor = factors
            q = [call.q * call.scale, query_factor.to(call.q.dtype)]
            k = [call.k, key_factor.to(call.k.dtype)]
        width = -(-sum(p.size(-1) for p in q) // HEAD_DIM_MULTIPLE) * HEAD_DIM_MULTIPLE
        attn_mask = None
        empty = empty_sample_mask(call.key_padding_mask)
        if call.key_padding_mask is not None:
            attn_mask = ~(call.key_padding_mask[:, None, None] & ~empty)
        out = F.scaled_dot_product_attention(_widen(q, width), _widen(k, width), _widen(v, width),
                                             attn_mask=attn_mask, dropout_p=call.dropout_p,
                                             scale=1.0 if factors is not None else call.scale)
        out = out[..., :call.v.size(-1)]
        return out if empty is None else out.masked_fill(empty, 0.0)
