"""``flex``: ``torch.nn.attention.flex_attention`` with the bias computed on the fly in a ``score_mod``.

Each bias part becomes a pure function of ``(batch, head, query, key)``
indices: the window decay is computed from the query's centre cell and the
key's cell, the segment value is looked up by the key's segment, a low-rank
term is a short dot product. On CUDA the kernel is compiled (Triton) and
never materialises ``[Q, K]``; on CPU flex_attention runs an unfused eager
implementation that does, has no backward for q/k/v, and is slow, so
``auto`` never picks it there. Applies every bias part and key padding; no
dropout.
"""
import functools
import importlib.util
import warnings
from typing import Callable, List

import torch
from torch import Tensor

from ..bias import BiasPart, DenseBias, LowRankBias, SegmentBias, WindowBias
from .base import AttentionBackend, AttentionCall

ScoreTerm = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _segment_term(part: SegmentBias, bs: int, heads: int) -> ScoreTerm:
    values = part.values.expand(bs, heads, -1, -1)
    starts = [start for start, _ in part.segment_bounds[1:]]

    def term(b, h, q_idx, kv_idx):
        segment = sum((kv_idx >= start).to(torch.int64) for start in starts)
        return values[b, h, q_idx, segment]

    return term


def _low_rank_term(part: LowRankBias, bs: int, heads: int) -> ScoreTerm:
    query_factor = part.query_factor.expand(bs, heads, -1, -1)
    key_factor = part.key_factor.expand(bs, -1, -1)

    def term(b, h, q_idx, kv_idx):
        return sum(query_factor[b, h, q_idx, r] * key_factor[b, kv_idx, r] for r in range(part.rank))

    return term


def _window_term(part: WindowBias, bs: int, heads: int) -> ScoreTerm:
    grids = [(grid, centres, valid, amplitude.expand(bs, heads, -1), window_size)
             for grid, centres, valid, amplitude, window_size in zip(part.grids, part.centres, part.valid,
                                                                      part.amplitude, part.window_size)]

    def term(b, h, q_idx, kv_idx):
        total = 0.0
        for grid, centres, valid, amplitude, window_size in grids:
            local = kv_idx - grid.offset
            cell = local % (grid.height * grid.width)
            dy = cell // grid.width - centres[b, q_idx, 1]
            dx = cell % grid.width - centres[b, q_idx, 2]
            radius = window_size // 2
            plane = local // (grid.height * grid.width)
            hit = ((local >= 0) & (local < grid.num_cells) & (plane == centres[b, q_idx, 0]) & (dy.abs() <= radius)
                   & (dx.abs() <= radius) & valid[b, q_idx])
            decay = torch.clamp(1.0 - torch.sqrt((dy * dy + dx * dx).float()) / (window_size / 2.0), min=0.0)
            total = total + torch.where(hit, amplitude[b, h, q_idx] * decay, 0.0)
        return total

    return term


def _dense_term(part: DenseBias, bs: int, heads: int, num_queries: int, num_keys: int) -> ScoreTerm:
    values = part.values.expand(bs, heads, num_queries, num_keys)
    if part.is_mask:
        return lambda b, h, q_idx, kv_idx: torch.where(values[b, h, q_idx, kv_idx], float('-inf'), 0.0)
    return lambda b, h, q_idx, kv_idx: values[b, h, q_idx, kv_idx]


def _part_term(part: BiasPart, call: AttentionCall) -> ScoreTerm:
    bs, heads, num_queries, _ = call.q.shape
    if isinstance(part, SegmentBias):
        return _segment_term(part, bs, heads)
    if isinstance(part, LowRankBias):
        return _low_rank_term(part, bs, heads)
    if isinstance(part, WindowBias):
        return _window_term(part, bs, heads)
    if isinstance(part, DenseBias):
        return _dense_term(part, bs, heads, num_queries, call.k.size(2))
    raise TypeError(f'flex has no score term for {part.describe()}')


def build_score_mod(call: AttentionCall) -> Callable:
    """The call's bias and key padding as a flex_attention ``score_mod``."""
    terms = [_part_term(part, call) for part in call.bias.parts] if call.bias is not None else []
    padding = call.key_padding_mask

    def score_mod(score, b, h, q_idx, kv_idx):
        for term in terms:
            score = score + term(b, h, q_idx, kv_idx)
        if padding is not None:
            score = torch.where(padding[b, kv_idx], float('-inf'), score)
        return score

    return score_mod


@functools.lru_cache(maxsize=None)
def _compiled_flex_attention() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention, dynamic=False)


class FlexBackend(AttentionBackend):
    """flex_attention with a ``score_mod`` built from the bias parts."""

    name = 'flex'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        reasons = []
        if call.dropout_p > 0:
            reasons.append(f'flex applies no attention dropout (got dropout_p={call.dropout_p})')
        if call.device_type == 'cpu' and call.qkv_need_grad:
            reasons.append('flex_attention has no backward on CPU (q, k or v requires grad)')
        elif call.device_type == 'cuda' and importlib.util.find_spec('triton') is None:
            reasons.append('flex on CUDA needs Triton, which is not installed')
        elif call.device_type not in ('cpu', 'cuda'):
            reasons.append(f'flex runs on cpu or cuda, not {call.device_type}')
        return reasons

    def forward(self, call: AttentionCall) -> Tensor:
        score_mod = build_score_mod(call)
        if call.device_type == 'cuda':
            return _compiled_flex_attention()(call.q, call.k, call.v, score_mod=score_mod, scale=call.scale)
        from torch.nn.attention.flex_attention import flex_attention
        with warnings.catch_warnings():
            # the eager CPU path is deliberate here (auto never picks it); torch's advice to compile does not apply
            warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')
            return flex_attention(call.q, call.k, call.v, score_mod=score_mod, scale=call.scale)
