"""The interface every part of an :class:`~.attention_bias.AttentionBias` implements, and the checks they share."""
import operator
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor


_SHAPE_NAMES = ('batch size', 'number of heads', 'number of queries')

#: a bias part as a pure function of indices, ``term(b, h, q_idx, kv_idx) -> B[b, h, q, kv]`` (the form of
#: ``flex_attention``'s ``score_mod``); the indices are tensors, so the term is traced, never looped
ScoreTerm = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _to_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f'{name} must be an int, got {value!r}')
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f'{name} must be an int, got {value!r}') from None
    if value < minimum:
        raise ValueError(f'{name} must be >= {minimum}, got {value}')
    return value


def _check_tensor(tensor, name: str, ndim: int, kind: str) -> Tensor:
    """Check that ``tensor`` is a Tensor with ``ndim`` dims of the given kind ('float', 'bool', 'int')."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f'{name} must be a Tensor, got {type(tensor).__name__}')
    if tensor.dim() != ndim:
        raise ValueError(f'{name} must have {ndim} dims, got shape {tuple(tensor.shape)}')
    ok = {'float': tensor.is_floating_point(),
          'bool': tensor.dtype == torch.bool,
          'int': not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool}[kind]
    if not ok:
        raise TypeError(f'{name} must be a {kind} tensor, got {tensor.dtype}')
    return tensor


def _float_to(tensor: Tensor, device, dtype) -> Tensor:
    """Move a float tensor, converting its dtype when one is given."""
    return tensor.to(device=device, dtype=dtype if dtype is not None else tensor.dtype)


class BiasPart:
    """One additive term of an :class:`AttentionBias`.

    Sizes: ``batch_size``, ``num_heads`` (1 when shared by all heads) and
    ``num_queries``. Structured parts must match the attention's batch size
    and number of queries exactly; only :class:`DenseBias` broadcasts them.
    """

    batch_size: int
    num_heads: int
    num_queries: int
    #: dims (0 batch, 1 heads, 2 queries) in which a size of 1 broadcasts
    broadcast_dims: Tuple[int, ...] = (1,)
    #: whether the part has a structure a kernel can apply without the dense tensor (not a :class:`DenseBias`)
    is_structured = True
    #: whether the part is a windowed (local) bias: non-zero on a few keys around each query's centre cells
    is_window = False
    #: whether the part is a bool mask (True = blocked) rather than an additive bias
    is_mask = False

    def check_keys(self, num_keys: int) -> None:
        """Raise ValueError if the part does not fit ``num_keys`` keys."""
        raise NotImplementedError

    def to_dense(self, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """The part as a tensor ``[bs | 1, heads | 1, Q | 1, num_keys]``."""
        raise NotImplementedError

    def to_low_rank(self) -> 'BiasPart':
        """The same bias as a :class:`LowRankBias`; TypeError for a part without a low-rank form."""
        raise TypeError(f'{self.describe()} has no low-rank form')

    def score_term(self, shape: Tuple[int, int, int, int], rows: Tensor) -> ScoreTerm:
        """The part as a pure function of indices: ``term(b, h, i, k) = B[b, h, rows[i], k]``.

        Args:
            shape (tuple[int, int, int, int]): ``(bs, heads, Q, K)`` of the
                attention; every tensor the term captures is expanded to it.
            rows (Tensor): long query index of every row the term serves
                (e.g. ``Q`` rows padded to a bucket, the extra ones repeating
                the last query).
        """
        raise NotImplementedError

    def select_queries(self, batch: int, queries: Tensor) -> 'BiasPart':
        """The part restricted to sample ``batch`` and the given query indices (batch size 1)."""
        raise NotImplementedError

    def restrict_keys(self, start: int, end: int) -> Optional['BiasPart']:
        """The part over the keys ``[start, end)``, renumbered from 0 (``B'[..., k] = B[..., start + k]``).

        The part keeps its structure (nothing ``[Q, K]``-sized is made); None
        when nothing of it falls in the range. The caller checks that the
        range lies inside the keys (:meth:`AttentionBias.restrict_keys`).
        """
        raise NotImplementedError

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'BiasPart':
        """Move the part; ``dtype`` converts its float tensors."""
        raise NotImplementedError

    def tensors(self) -> Tuple[Tensor, ...]:
        """Every tensor the part holds."""
        raise NotImplementedError

    @property
    def requires_grad(self) -> bool:
        """Whether any tensor of the part requires grad."""
        return any(t.requires_grad for t in self.tensors())

    @property
    def device(self) -> torch.device:
        """Device of the part's tensors."""
        return self.tensors()[0].device

    def sizes(self) -> Tuple[int, int, int]:
        """``(batch_size, num_heads, num_queries)``."""
        return self.batch_size, self.num_heads, self.num_queries

    def check(self, batch_size: int, num_heads: int, num_queries: int) -> None:
        """Raise ValueError naming the first size that does not fit the attention."""
        expected = (batch_size, num_heads, num_queries)
        for dim, (name, have, want) in enumerate(zip(_SHAPE_NAMES, self.sizes(), expected)):
            if have != want and not (have == 1 and dim in self.broadcast_dims):
                allowed = f'{want} or 1' if dim in self.broadcast_dims else f'{want}'
                raise ValueError(f'{self.describe()}: {name} is {have}, the attention needs {allowed}')

    def describe(self) -> str:
        """Short description for logs and error messages."""
        return (f'{type(self).__name__}(bs={self.batch_size}, heads={self.num_heads}, '
                f'Q={self.num_queries})')

    __repr__ = describe
