"""Attention backends, one per module, each stating what it cannot apply (``segment`` is a sub-package: the
backend with its fused kernels, window slot products and exact row recomputation).

``BACKENDS`` maps a backend name to its instance; ``apply_attention`` in
``..dispatch`` picks one (``backend='auto'``) or runs the one asked for.
"""
from .base import AttentionBackend, AttentionCall, UnsupportedAttentionError
from .flash_attn import FlashAttnBackend
from .flashbias import FlashBiasBackend
from .flex import FlexBackend
from .math import MathBackend, reference_attention, reference_probabilities
from .sdpa import SdpaBackend
from .segment import SegmentBackend

BACKENDS = {
    backend.name: backend
    for backend in (MathBackend(), SdpaBackend(), SegmentBackend(), FlashBiasBackend(), FlexBackend(),
                    FlashAttnBackend())
}

__all__ = [
    'AttentionBackend', 'AttentionCall', 'UnsupportedAttentionError', 'BACKENDS', 'MathBackend', 'SdpaBackend',
    'SegmentBackend', 'FlashBiasBackend', 'FlexBackend', 'FlashAttnBackend', 'reference_attention',
    'reference_probabilities'
]
