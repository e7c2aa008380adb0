"""The :class:`DenseBias`: an ordinary tensor (additive float, or bool with True = blocked)."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .part import BiasPart, ScoreTerm, _float_to


class DenseBias(BiasPart):
    """An unstructured bias tensor.

    Args:
        values (Tensor): broadcastable to ``[bs, heads, Q, K]`` (up to 4 dims,
            missing leading dims count as 1). Float: added to the scores; bool:
            True = blocked.
    """

    broadcast_dims = (0, 1, 2)
    is_structured = False

    def __init__(self, values: Tensor) -> None:
        if not isinstance(values, Tensor):
            raise TypeError(f'DenseBias.values must be a Tensor, got {type(values).__name__}')
        if values.dim() > 4 or values.dim() < 1:
            raise ValueError(f'a dense bias must have 1 to 4 dims, got shape {tuple(values.shape)}')
        if not (values.is_floating_point() or values.dtype == torch.bool):
            raise TypeError(f'a dense bias must be float (additive) or bool (True = blocked), got {values.dtype}')
        self.values = values.reshape((1, ) * (4 - values.dim()) + tuple(values.shape))
        self.batch_size, self.num_heads, self.num_queries = (int(s) for s in self.values.shape[:3])

    @property
    def is_mask(self) -> bool:
        """True for a bool mask (True = blocked)."""
        return self.values.dtype == torch.bool

    def check_keys(self, num_keys: int) -> None:
        if self.values.size(-1) not in (1, num_keys):
            raise ValueError(f'dense bias of shape {tuple(self.values.shape)} does not fit {num_keys} keys')

    def to_dense(self, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
        self.check_keys(num_keys)
        if self.is_mask:
            dense = torch.zeros(self.values.shape, dtype=dtype, device=self.values.device)
            dense = dense.masked_fill(self.values, float('-inf'))
        else:
            dense = self.values.to(dtype)
        return dense.expand(-1, -1, -1, num_keys)

    def score_term(self, shape: Tuple[int, int, int, int], rows: Tensor) -> ScoreTerm:
        values = self.values.expand(shape).index_select(2, rows)
        if self.is_mask:
            return lambda b, h, q_idx, kv_idx: torch.where(values[b, h, q_idx, kv_idx], float('-inf'), 0.0)
        return lambda b, h, q_idx, kv_idx: values[b, h, q_idx, kv_idx]

    def select_queries(self, batch: int, queries: Tensor) -> 'DenseBias':
        values = self.values[batch:batch + 1] if self.batch_size > 1 else self.values
        return DenseBias(values[:, :, queries] if self.num_queries > 1 else values)

    def restrict_keys(self, start: int, end: int) -> 'DenseBias':
        """The last dim sliced (a size of 1 broadcasts and is kept)."""
        return self if self.values.size(-1) == 1 else DenseBias(self.values[..., start:end])

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'DenseBias':
        return DenseBias(self.values.to(device) if self.is_mask else _float_to(self.values, device, dtype))

    def tensors(self) -> Tuple[Tensor, ...]:
        return (self.values, )

    def describe(self) -> str:
        kind = 'bool mask' if self.is_mask else str(self.values.dtype).replace('torch.', '')
        return f'DenseBias({kind}, shape={tuple(self.values.shape)})'
