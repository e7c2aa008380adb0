"""``flex``: ``torch.nn.attention.flex_attention`` with the bias computed on the fly in a ``score_mod``.

Each bias part is a pure function of ``(batch, head, query, key)`` indices
(:meth:`~..bias.BiasPart.score_term`): the window decay is computed from the
query's centre cell and the key's cell, the segment value is looked up by the
key's segment, a low-rank term is a short dot product. On CUDA the kernel is
compiled (Triton), once for all shapes (:func:`compiled_flex_attention`), and
never materialises ``[Q, K]``; on CPU flex_attention runs an unfused eager
implementation that does, has no backward for q/k/v, and is slow. ``auto``
never picks ``flex`` (see :mod:`..dispatch`): it runs only when named.
Applies every bias part and key padding; no dropout.
"""
import functools
import importlib.util
import warnings
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import AttentionBackend, AttentionCall

#: compiled calls pad the query count to a multiple of this (DN training changes it every batch: a few buckets,
#: hence a few compiles, instead of one compile per count)
QUERY_BUCKET = 256


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
    shape = (*call.q.shape[:3], call.k.size(2))
    terms = [part.score_term(shape, rows) for part in call.bias.parts] if call.bias is not None else []
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
    CPU (far from ``math``). Callers keep the
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
