"""Bias-aware attention: structured additive biases and the backends that apply them exactly.

``apply_attention(q, k, v, bias=...)`` is the entry point; ``bias`` is a
tensor or an :class:`AttentionBias` built from :class:`SegmentBias`,
:class:`LowRankBias`, :class:`WindowBias` (on :class:`KeyGrid` s) and
:class:`DenseBias` parts. Nothing here imports optional CUDA packages.
"""
from .backends import BACKENDS, UnsupportedAttentionError
from .bias import (AttentionBias, BiasPart, DenseBias, KeyGrid, LowRankBias, SegmentBias, WindowBias,
                   as_attention_bias, window_stencil)
from .dispatch import apply_attention, select_backend

__all__ = [
    'AttentionBias', 'BiasPart', 'DenseBias', 'KeyGrid', 'LowRankBias', 'SegmentBias', 'WindowBias',
    'as_attention_bias', 'window_stencil', 'apply_attention', 'select_backend', 'BACKENDS',
    'UnsupportedAttentionError'
]
