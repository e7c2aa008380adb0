"""The :class:`SegmentBias`: one value per query for each contiguous segment of keys (the AQR global bias)."""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ...utils.host_data import device_constant
from .low_rank import LowRankBias
from .part import BiasPart, ScoreTerm, _check_tensor, _float_to, _to_int


class SegmentBias(BiasPart):
    """A bias that is constant per query over each contiguous segment of keys.

    ``B[b, h, q, k] = values[b, h, q, s]`` for key ``k`` in segment ``s``.
    The AQR global bias has two segments: the ``H_bev * W_bev`` BEV keys and
    the ``N * h * w`` camera keys. It is the rank-S product ``values @ V^T``
    with ``V`` the one-hot segment indicator of the keys (:meth:`to_low_rank`).

    Args:
        values (Tensor): ``[bs, heads | 1, Q, S]`` float (differentiable).
        segment_lengths (Sequence[int]): S positive lengths; their sum is the
            number of keys.
    """

    def __init__(self, values: Tensor, segment_lengths: Sequence[int]) -> None:
        self.values = _check_tensor(values, 'SegmentBias.values', 4, 'float')
        self.segment_lengths = tuple(_to_int(n, 'a segment length', 1) for n in segment_lengths)
        if values.size(-1) != len(self.segment_lengths):
            raise ValueError(f'SegmentBias.values has {values.size(-1)} segments in its last dim but '
                             f'{len(self.segment_lengths)} segment lengths were given')
        self.batch_size, self.num_heads, self.num_queries = (int(s) for s in values.shape[:3])

    @property
    def num_keys(self) -> int:
        """Total number of keys (sum of the segment lengths)."""
        return sum(self.segment_lengths)

    @property
    def segment_bounds(self) -> List[Tuple[int, int]]:
        """``(start, end)`` key range of each segment."""
        ends = [0]
        for length in self.segment_lengths:
            ends.append(ends[-1] + length)
        return list(zip(ends[:-1], ends[1:]))

    def check_keys(self, num_keys: int) -> None:
        if self.num_keys != num_keys:
            raise ValueError(f'SegmentBias segments {self.segment_lengths} cover {self.num_keys} keys, the attention '
                             f'has {num_keys}')

    def to_dense(self, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
        self.check_keys(num_keys)
        repeats = device_constant(self.segment_lengths, self.values.device, torch.long)
        return self.values.to(dtype).repeat_interleave(repeats, dim=-1, output_size=num_keys)

    def to_low_rank(self) -> 'LowRankBias':
        """The same bias as ``values @ one_hot(segment of key)^T``."""
        repeats = device_constant(self.segment_lengths, self.values.device, torch.long)
        indicator = torch.eye(len(self.segment_lengths), dtype=self.values.dtype, device=self.values.device)
        indicator = indicator.repeat_interleave(repeats, dim=0, output_size=self.num_keys)
        return LowRankBias(self.values, indicator[None])

    def score_term(self, shape: Tuple[int, int, int, int], rows: Tensor) -> ScoreTerm:
        bs, heads = shape[:2]
        values = self.values.expand(bs, heads, -1, -1).index_select(2, rows)
        starts = [start for start, _ in self.segment_bounds[1:]]

        def term(b, h, q_idx, kv_idx):
            segment = sum((kv_idx >= start).to(torch.int64) for start in starts)
            return values[b, h, q_idx, segment]

        return term

    def select_queries(self, batch: int, queries: Tensor) -> 'SegmentBias':
        return SegmentBias(self.values[batch:batch + 1, :, queries], self.segment_lengths)

    def restrict_keys(self, start: int, end: int) -> Optional['SegmentBias']:
        """The segments that meet the range, cut to it."""
        kept = [(index, min(seg_end, end) - max(seg_start, start))
                for index, (seg_start, seg_end) in enumerate(self.segment_bounds)
                if seg_start < end and seg_end > start]
        if not kept:
            return None
        first, last = kept[0][0], kept[-1][0]
        return SegmentBias(self.values[..., first:last + 1], [length for _, length in kept])

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'SegmentBias':
        return SegmentBias(_float_to(self.values, device, dtype), self.segment_lengths)

    def tensors(self) -> Tuple[Tensor, ...]:
        return (self.values, )

    def describe(self) -> str:
        return (f'SegmentBias(bs={self.batch_size}, heads={self.num_heads}, Q={self.num_queries}, '
                f'segments={self.segment_lengths})')
