"""Bias-aware attention: structured additive biases and the backends that apply them exactly.

``apply_attention(q, k, v, bias=...)`` is the entry point; ``bias`` is a
tensor or an :class:`AttentionBias` built from :class:`SegmentBias`,
:class:`LowRankBias`, :class:`WindowBias` (on :class:`KeyGrid` s) and
:class:`DenseBias` parts; :func:`restrict_keys` cuts any of them to a key
range; :class:`PerLayer` holds one bias per decoder layer (``LayerBias`` /
``DecoderBias``: the types of a layer's and a decoder's bias). Also public:
:func:`pop_inexact_rows` (rows the ``segment`` backend left inexact on an
accelerator, for the training log) and :class:`SlotPattern` (``slots/``:
sparse products over per-query key slots, for attention over window tokens).
Nothing here imports optional CUDA packages.
"""
from .backends import BACKENDS, UnsupportedAttentionError
from .backends.segment import pop_inexact_rows
from .bias import (AttentionBias, BiasPart, DecoderBias, DenseBias, KeyGrid, LayerBias, LowRankBias, PerLayer,
                   SegmentBias, WindowBias, as_attention_bias, restrict_keys, window_stencil)
from .dispatch import apply_attention, select_backend
from .slots import SlotPattern

__all__ = [
    'AttentionBias', 'BiasPart', 'DecoderBias', 'DenseBias', 'KeyGrid', 'LayerBias', 'LowRankBias', 'PerLayer',
    'SegmentBias', 'WindowBias', 'as_attention_bias', 'restrict_keys', 'window_stencil', 'apply_attention',
    'select_backend', 'BACKENDS', 'UnsupportedAttentionError', 'pop_inexact_rows', 'SlotPattern'
]
