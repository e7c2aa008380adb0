"""Attention backends, one per module, each stating what it cannot apply (``segment`` and ``tiled_bias`` are
sub-packages: a backend with its kernels and helpers).

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
from .tiled_bias import TiledBiasBackend

BACKENDS = {
    backend.name: backend
    for backend in (MathBackend(), SdpaBackend(), SegmentBackend(), FlashBiasBackend(), FlexBackend(),
                    FlashAttnBackend(), TiledBiasBackend())
}

__all__ = [
    'AttentionBackend', 'AttentionCall', 'UnsupportedAttentionError', 'BACKENDS', 'MathBackend', 'SdpaBackend',
    'SegmentBackend', 'FlashBiasBackend', 'FlexBackend', 'FlashAttnBackend', 'TiledBiasBackend', 'reference_attention',
    'reference_probabilities'
]
