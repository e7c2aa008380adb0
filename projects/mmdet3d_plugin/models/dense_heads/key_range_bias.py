"""A cross-attention bias restricted to a contiguous range of its keys.

The fused decoder's keys are ``[BEV tokens ; camera tokens]``; a decoding
pass over one modality's tokens only (``modality_passes.py``) needs the bias
of exactly those keys, renumbered from 0: ``B'[..., k] = B[..., start + k]``
for ``k < end - start``. Each part of an :class:`AttentionBias` keeps its
structure (nothing ``[Q, K]``-sized is built):

* :class:`SegmentBias`: the segments that meet the range, cut to it;
* :class:`LowRankBias`: the key factor's rows of the range;
* :class:`WindowBias`: the key grids inside the range, moved by ``-start``
  (a grid that straddles a range end raises: a window cannot be cut);
* :class:`DenseBias` and plain tensors: the last dim sliced (a size of 1 broadcasts).

A part with nothing in the range is dropped; a bias left without parts is None.
"""
from typing import Optional, Union

from torch import Tensor

from ...attention import AttentionBias, BiasPart, DenseBias, KeyGrid, LowRankBias, SegmentBias, WindowBias
from ..utils.petr_transformer import PerLayer

CrossAttentionBias = Union[None, Tensor, AttentionBias, PerLayer]


def restrict_to_keys(bias: CrossAttentionBias, start: int, end: int) -> CrossAttentionBias:
    """The bias of the keys ``[start, end)``, renumbered from 0.

    Args:
        bias (None | Tensor | AttentionBias | PerLayer): a cross-attention
            bias over K keys (a tensor: ``[..., K]``, last dim 1 broadcasts;
            a :class:`PerLayer`: one of them per decoder layer).
        start (int): first key kept.
        end (int): one past the last key kept, ``start < end <= K``.

    Returns:
        The same kind of bias over ``end - start`` keys; None when nothing of
        it falls in the range.
    """
    if bias is None:
        return None
    if isinstance(bias, PerLayer):
        return PerLayer(restrict_to_keys(layer_bias, start, end) for layer_bias in bias)
    if isinstance(bias, Tensor):
        return bias if bias.size(-1) == 1 else bias[..., start:end]
    if not isinstance(bias, AttentionBias):
        raise TypeError(f'cannot restrict a {type(bias).__name__} to a key range; expected None, a Tensor, an '
                        f'AttentionBias or a PerLayer of them')
    if not 0 <= start < end <= bias.num_keys:
        raise ValueError(f'key range [{start}, {end}) is not inside the {bias.num_keys} keys of {bias.describe()}')
    parts = [part for part in (_restrict_part(part, start, end) for part in bias.parts) if part is not None]
    return AttentionBias(parts, end - start) if parts else None


def _restrict_part(part: BiasPart, start: int, end: int) -> Optional[BiasPart]:
    if isinstance(part, SegmentBias):
        return _restrict_segments(part, start, end)
    if isinstance(part, LowRankBias):
        return LowRankBias(part.query_factor, part.key_factor[:, start:end])
    if isinstance(part, WindowBias):
        return _restrict_windows(part, start, end)
    if isinstance(part, DenseBias):
        return part if part.values.size(-1) == 1 else DenseBias(part.values[..., start:end])
    raise TypeError(f'cannot restrict {part.describe()} to a key range: unknown bias part')


def _restrict_segments(part: SegmentBias, start: int, end: int) -> Optional[SegmentBias]:
    kept = [(index, min(seg_end, end) - max(seg_start, start))
            for index, (seg_start, seg_end) in enumerate(part.segment_bounds) if seg_start < end and seg_end > start]
    if not kept:
        return None
    first, last = kept[0][0], kept[-1][0]
    return SegmentBias(part.values[..., first:last + 1], [length for _, length in kept])


def _restrict_windows(part: WindowBias, start: int, end: int) -> Optional[WindowBias]:
    kept = []
    for index, grid in enumerate(part.grids):
        if grid.offset >= start and grid.end <= end:
            kept.append(index)
        elif grid.offset < end and grid.end > start:
            raise ValueError(f'key range [{start}, {end}) cuts the window grid {grid} of {part.describe()}')
    if not kept:
        return None
    grids = [part.grids[i] for i in kept]
    return WindowBias([KeyGrid(g.offset - start, g.planes, g.height, g.width) for g in grids],
                      [part.centres[i] for i in kept], [part.valid[i] for i in kept],
                      [part.amplitude[i] for i in kept], [part.window_size[i] for i in kept])
