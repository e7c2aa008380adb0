"""Transformer, attention and geometry building blocks of CMT."""
from ...attention.bias import PerLayer
from .cmt_transformer import CmtTransformer
from .grid_mask import GridMask
from .group_layer_norm import GroupLayerNorm1d
from .petr_attention import PETRMultiheadAttention, PETRMultiheadFlashAttention
from .petr_transformer import PETRTransformerDecoder, PETRTransformerDecoderLayer
from .spconv_voxelize import SPConvVoxelization

__all__ = [
    'CmtTransformer', 'GridMask', 'GroupLayerNorm1d',
    'PETRMultiheadAttention', 'PETRMultiheadFlashAttention', 'PETRTransformerDecoder',
    'PETRTransformerDecoderLayer', 'PerLayer', 'SPConvVoxelization'
]
