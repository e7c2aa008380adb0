"""The :class:`LowRankBias`: a low-rank term ``U V^T`` of the scores."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .part import BiasPart, ScoreTerm, _check_tensor, _float_to


class LowRankBias(BiasPart):
    """A low-rank bias ``B[b, h] = query_factor[b, h] @ key_factor[b]^T``.

    Args:
        query_factor (Tensor): ``U`` ``[bs, heads | 1, Q, r]`` float.
        key_factor (Tensor): ``V`` ``[bs | 1, K, r]`` float.
    """

    def __init__(self, query_factor: Tensor, key_factor: Tensor) -> None:
        self.query_factor = _check_tensor(query_factor, 'LowRankBias.query_factor', 4, 'float')
        self.key_factor = _check_tensor(key_factor, 'LowRankBias.key_factor', 3, 'float')
        self.batch_size, self.num_heads, self.num_queries, rank = (int(s) for s in query_factor.shape)
        if key_factor.size(-1) != rank:
            raise ValueError(f'LowRankBias: query_factor has rank {rank}, key_factor {tuple(key_factor.shape)} has '
                             f'rank {key_factor.size(-1)}')
        if key_factor.size(0) not in (1, self.batch_size):
            raise ValueError(f'LowRankBias: key_factor batch size {key_factor.size(0)} must be 1 or '
                             f'{self.batch_size}')

    @property
    def rank(self) -> int:
        """r."""
        return self.query_factor.size(-1)

    @property
    def num_keys(self) -> int:
        """K."""
        return self.key_factor.size(1)

    def check_keys(self, num_keys: int) -> None:
        if self.num_keys != num_keys:
            raise ValueError(f'LowRankBias.key_factor has {self.num_keys} keys, the attention has {num_keys}')

    def to_dense(self, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
        self.check_keys(num_keys)
        return torch.matmul(self.query_factor.to(dtype), self.key_factor.to(dtype).transpose(-1, -2)[:, None])

    def to_low_rank(self) -> 'LowRankBias':
        return self

    def score_term(self, shape: Tuple[int, int, int, int], rows: Tensor) -> ScoreTerm:
        bs, heads = shape[:2]
        query_factor = self.query_factor.expand(bs, heads, -1, -1).index_select(2, rows)
        key_factor = self.key_factor.expand(bs, -1, -1)
        rank = self.rank

        def term(b, h, q_idx, kv_idx):
            return sum(query_factor[b, h, q_idx, r] * key_factor[b, kv_idx, r] for r in range(rank))

        return term

    def select_queries(self, batch: int, queries: Tensor) -> 'LowRankBias':
        key_factor = self.key_factor if self.key_factor.size(0) == 1 else self.key_factor[batch:batch + 1]
        return LowRankBias(self.query_factor[batch:batch + 1, :, queries], key_factor)

    def restrict_keys(self, start: int, end: int) -> 'LowRankBias':
        """The key factor's rows of the range."""
        return LowRankBias(self.query_factor, self.key_factor[:, start:end])

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'LowRankBias':
        return LowRankBias(_float_to(self.query_factor, device, dtype), _float_to(self.key_factor, device, dtype))

    def tensors(self) -> Tuple[Tensor, ...]:
        return self.query_factor, self.key_factor

    def describe(self) -> str:
        return (f'LowRankBias(bs={self.batch_size}, heads={self.num_heads}, Q={self.num_queries}, '
                f'rank={self.rank})')
