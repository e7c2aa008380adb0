"""Structured additive attention biases.

An :class:`AttentionBias` describes the additive term ``B`` of
``softmax(q k^T * scale + B) v`` without materialising the ``[bs, heads, Q, K]``
tensor. It is a sum of small typed parts, each of which a kernel may know how to
apply directly:

* :class:`SegmentBias`: one value per query for each contiguous segment of keys
  (the AQR global bias: one value for the BEV keys, one for the camera keys);
* :class:`LowRankBias`: a general low-rank term ``U V^T``;
* :class:`WindowBias`: per query, a linearly decaying square window around a
  centre cell on one or more key grids (the AQR local bias);
* :class:`DenseBias`: an ordinary tensor (additive float, or bool with True =
  blocked), for masks that have no structure.

Every part offers ``to_dense`` for the reference backend, tests and pictures,
``score_term`` (the part as a pure function of ``(batch, head, query, key)``
indices), ``select_queries`` and ``restrict_keys`` (the part over fewer queries or a key range, keeping its
structure), and says what a backend needs to know of it (``is_structured``, ``is_window``, ``is_mask``) without a
type test. Constructors only store tensors and check their shapes (no data-dependent checks, so no device sync).

One module per type: :mod:`.part` (the interface), :mod:`.key_grid`, :mod:`.segment`, :mod:`.low_rank`,
:mod:`.window` (cells: :mod:`.window_cells`), :mod:`.dense`, :mod:`.attention_bias` (the sum, its per-layer form
``PerLayer``, the types ``LayerBias`` / ``DecoderBias`` of a layer's / a decoder's bias, the functions on any bias).
"""
from .attention_bias import AttentionBias, DecoderBias, LayerBias, PerLayer, as_attention_bias, restrict_keys
from .dense import DenseBias
from .key_grid import KeyGrid
from .low_rank import LowRankBias
from .part import BiasPart, ScoreTerm
from .segment import SegmentBias
from .window import WindowBias, WindowKeys, check_disjoint_grids
from .window_cells import window_stencil

__all__ = [
    'AttentionBias', 'BiasPart', 'DecoderBias', 'DenseBias', 'KeyGrid', 'LayerBias', 'LowRankBias', 'PerLayer',
    'ScoreTerm', 'SegmentBias', 'WindowBias', 'WindowKeys', 'as_attention_bias', 'check_disjoint_grids',
    'restrict_keys', 'window_stencil'
]
