"""``flex``: ``torch.nn.attention.flex_attention`` with the bias computed on the fly in a ``score_mod``.

Each bias part becomes a pure function of ``(batch, head, query, key)``
indices: the window decay is computed from the query's centre cell and the
key's cell, the segment value is looked up by the key's segment, a low-rank
term is a short dot product. On CUDA the kernel is compiled (Triton), once
for all shapes (:func:`compiled_flex_attention`), and never materialises
``[Q, K]``; on CPU flex_attention runs an unfused eager implementation that
does, has no backward for q/k/v, and is slow. ``auto`` never picks ``flex``
(see :mod:`..dispatch`): it runs only when named. Applies every bias part and key padding; no
dropout.
"""
import functools
import importlib.util
import warnings
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ..bias import BiasPart, DenseBias, LowRankBias, SegmentBias, WindowBias
from .base import AttentionBackend, AttentionCall

ScoreTerm = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

#: compiled calls pad the query count to a multiple of this (DN training changes it every batch: a few buckets,
#: hence a few compiles, instead of one compile per count)
QUERY_BUCKET = 256


def _segment_term(part: SegmentBias, bs: int, heads: int, rows: Tensor) -> ScoreTerm:
    values = part.values.expand(bs, heads, -1, -1).index_select(2, rows)
    starts = [start for start, _ in part.segment_bounds[1:]]

    def term(b, h, q_idx, kv_idx):
        segment = sum((kv_idx >= start).to(torch.int64) for start in starts)
        return values[b, h, q_idx, segment]

    return term


def _low_rank_term(part: LowRankBias, bs: int, heads: int, rows: Tensor) -> ScoreTerm:
    query_factor = part.query_factor.expand(bs, heads, -1, -1).index_select(2, rows)
    key_factor = part.key_factor.expand(bs, -1, -1)

    def term(b, h, q_idx, kv_idx):
        return sum(query_factor[b, h, q_idx, r] * key_factor[b, kv_idx, r] for r in range(part.rank))

    return term


def _window_term(part: WindowBias, bs: int, heads: int, rows: Tensor) -> ScoreTerm:
    grids = [(grid, centres.index_select(1, rows), valid.index_select(1, rows),
              amplitude.expand(bs, heads, -1).index_select(2, rows), window_size)
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


def _dense_term(part: DenseBias, bs: int, heads: int, rows: Tensor, num_queries: int, num_keys: int) -> ScoreTerm:
    values = part.values.expand(bs, heads, num_queries, num_keys).index_select(2, rows)
    if part.is_mask:
        return lambda b, h, q_idx, kv_idx: torch.where(values[b, h, q_idx, kv_idx], float('-inf'), 0.0)
    return lambda b, h, q_idx, kv_idx: values[b, h, q_idx, kv_idx]


def _part_term(part: BiasPart, call: AttentionCall, rows: Tensor) -> ScoreTerm:
    bs, heads, num_queries, _ = call.q.shape
    if isinstance(part, SegmentBias):
        return _segment_term(part, bs, heads, rows)
    if isinstance(part, LowRankBias):
        return _low_rank_term(part, bs, heads, rows)
    if isinstance(part, WindowBias):
        return _window_term(part, bs, heads, rows)
    if isinstance(part, DenseBias):
        return _dense_term(part, bs, heads, rows, num_queries, call.k.size(2))
    raise TypeError(f'flex has no score term for {part.describe()}')


def build_score_mod(call: AttentionCall, num_rows: Optional[int] = None) -> Callable:
    """The call's bias and key padding as a flex_attention ``score_mod``.

    Args:
        call (AttentionCall): the call.
        num_rows (int, optional): query rows the ``score_mod`` serves (at least
            Q; default Q). Rows past Q repeat the last query's bias (their
            outputs are dropped), so every tensor it captures has ``num_rows``
            queries.
    """
    num_queries = call.q.size(2)
    rows = torch.arange(num_rows or num_queries, device=call.q.device).clamp_(max=num_queries - 1)
    terms = [_part_term(part, call, rows) for part in call.bias.parts] if call.bias is not None else []
    padding = call.key_padding_mask

    def score_mod(score, b, h, q_idx, kv_idx):
        for term in terms:
            score = score + term(b, h, q_idx, kv_idx)
        if padding is not None:
            score = torch.where(padding[b, kv_idx], float('-inf'), score)
        return score

    return score_mod


@functools.lru_cache(maxsize=None)
def compiled_flex_attention() -> Callable:
    """flex_attention compiled for fixed shapes (the CUDA path; CPU inference can call it too).

    Shape-specialised (``dynamic=False``): on torch 2.13 the dynamic-shape
    compile of a window + segment ``score_mod`` returns wrong outputs on the
    CPU (0.4 relative error against ``math``, measured). Callers keep the
    number of compiles small by padding the query count to a bucket
    (:func:`query_bucket`). ``fullgraph=True`` and
    ``fail_on_recompile_limit_hit`` turn a graph break or a recompile storm
    into an error instead of a silent fall-back to eager flex (which
    materialises ``[bs, heads, Q, K]``).
    """
    from torch.nn.attention.flex_attention import flex_attention
    compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)

    @functools.wraps(flex_attention)
    def run(*args, **kwargs):
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            return compiled(*args, **kwargs)

    return run


def query_bucket(num_queries: int) -> int:
    """The padded query count of a compiled flex call: the next multiple of :data:`QUERY_BUCKET`."""
    return -(-num_queries // QUERY_BUCKET) * QUERY_BUCKET


def run_compiled(call: AttentionCall) -> Tensor:
    """The call through :func:`compiled_flex_attention`, queries padded to :func:`query_bucket` rows.

    Returns:
        Tensor: ``[bs, heads, Q, d]``.
    """
    num_queries = call.q.size(2)
    rows = query_bucket(num_queries)
    q = F.pad(call.q, (0, 0, 0, rows - num_queries))
    out = compiled_flex_attention()(q, call.k, call.v, score_mod=build_score_mod(call, rows), scale=call.scale)
    return out[:, :, :num_queries]


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
        if call.device_type == 'cuda':
            return run_compiled(call)
        from torch.nn.attention.flex_attention import flex_attention
        with warnings.catch_warnings():
            # the eager CPU path is deliberate here (auto never picks it); torch's advice to compile does not apply
            warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')
            return flex_attention(call.q, call.k, call.v, score_mod=build_score_mod(call), scale=call.scale)
