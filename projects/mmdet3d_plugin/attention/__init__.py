"""Bias-aware attention: structured additive biases and the backends that apply them exactly.

``apply_attention(q, k, v, bias=...)`` is the entry point; ``bias`` is a
tensor or an :class:`AttentionBias` built from :class:`SegmentBias`,
:class:`LowRankBias`, :class:`WindowBias` (on :class:`KeyGrid` s) and
:class:`DenseBias` parts; :func:`restrict_keys` cuts any of them to a key
range. Also public: :func:`pop_inexact_rows` (rows the ``segment`` backend
left inexact on an accelerator, for the training log) and :class:`SlotPattern`
(sparse products over per-query key slots, for attention over window tokens).
Nothing here imports optional CUDA packages.
"""
from .backends import BACKENDS, UnsupportedAttentionError
from .backends.segment import SlotPattern, pop_inexact_rows
from .bias import (AttentionBias, BiasPart, DenseBias, KeyGrid, LowRankBias, SegmentBias, WindowBias,
                   as_attention_bias, restrict_keys, window_stencil)
from .dispatch import apply_attention, select_backend

__all__ = [
    'AttentionBias', 'BiasPart', 'DenseBias', 'KeyGrid', 'LowRankBias', 'SegmentBias', 'WindowBias',
    'as_attention_bias', 'restrict_keys', 'window_stencil', 'apply_attention', 'select_backend', 'BACKENDS',
    'UnsupportedAttentionError', 'pop_inexact_rows', 'SlotPattern'
]
