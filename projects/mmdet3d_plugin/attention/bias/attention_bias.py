"""The :class:`AttentionBias` (a sum of bias parts over the keys of one call), its per-layer form :class:`PerLayer`,
the types a layer's and a decoder's bias take (``LayerBias``, ``DecoderBias``) and the functions that take any bias."""
from typing import Callable, Hashable, List, Optional, Sequence, TypeVar, Union

import torch
from torch import Tensor

from .dense import DenseBias
from .part import _SHAPE_NAMES, BiasPart, _to_int
from .window import WindowBias, check_disjoint_grids

T = TypeVar('T')


class AttentionBias:
    """A structured additive attention bias: the sum of its parts.

    A bias is a value: the decoder layers share one, and what the backends
    derive from it (window slots, slot patterns, the dense form:
    :meth:`derived`) is made on the first call and reused while it lives, so
    its tensors must not be changed in place once it is built (build a new
    bias instead).

    Args:
        parts (BiasPart | Sequence[BiasPart]): the terms (at least one).
        num_keys (int): K, the number of keys the bias applies to.

    Attributes:
        batch_size, num_heads, num_queries (int): sizes of the bias; a size of
            1 broadcasts (heads: shared by all heads).
    """

    def __init__(self, parts: Union[BiasPart, Sequence[BiasPart]], num_keys: int) -> None:
        self.parts = (parts, ) if isinstance(parts, BiasPart) else tuple(parts)
        if not self.parts:
            raise ValueError('an AttentionBias needs at least one part')
        for part in self.parts:
            if not isinstance(part, BiasPart):
                raise TypeError(f'AttentionBias parts must be BiasPart instances, got {type(part).__name__}')
        self.num_keys = _to_int(num_keys, 'num_keys', 1)
        for part in self.parts:
            part.check_keys(self.num_keys)
        sizes = []
        for dim, name in enumerate(_SHAPE_NAMES):
            values = {part.sizes()[dim] for part in self.parts}
            exact = {part.sizes()[dim] for part in self.parts if dim not in part.broadcast_dims}
            if len(exact) > 1 or len(values - {1}) > 1 or (exact and values - {1} - exact):
                raise ValueError(f'AttentionBias parts disagree on the {name}: '
                                 f'{[p.describe() for p in self.parts]}')
            sizes.append(max(values))
        self.batch_size, self.num_heads, self.num_queries = sizes
        check_disjoint_grids([grid for part in self.parts_of_type(WindowBias) for grid in part.grids])
        self._derived = {}

    def derived(self, key: Hashable, make: Callable[[], T]) -> T:
        """What a backend derives from this bias, made by ``make`` on the first call with ``key`` and returned again
        on the later ones while the bias lives (the decoder layers share one bias)."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def parts_of_type(self, cls) -> List[BiasPart]:
        """The parts that are instances of ``cls``."""
        return [part for part in self.parts if isinstance(part, cls)]

    def check(self, batch_size: int, num_heads: int, num_queries: int, num_keys: int) -> None:
        """Raise ValueError naming the mismatch if the bias does not fit ``[bs, heads, Q, K]`` scores."""
        if num_keys != self.num_keys:
            raise ValueError(f'{self.describe()} is for {self.num_keys} keys, the attention has {num_keys}')
        for part in self.parts:
            part.check(batch_size, num_heads, num_queries)

    def to_dense(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The bias as a tensor ``[bs | 1, heads | 1, Q | 1, K]`` (the sum of the parts, broadcast)."""
        dense = self.parts[0].to_dense(self.num_keys, dtype)
        for part in self.parts[1:]:
            dense = dense + part.to_dense(self.num_keys, dtype)
        return dense

    def select_queries(self, batch: int, queries: Tensor) -> 'AttentionBias':
        """The bias of sample ``batch`` restricted to the query indices ``queries`` (batch size 1)."""
        return AttentionBias([part.select_queries(batch, queries) for part in self.parts], self.num_keys)

    def restrict_keys(self, start: int, end: int) -> Optional['AttentionBias']:
        """The bias of the keys ``[start, end)``, renumbered from 0: ``B'[..., k] = B[..., start + k]``.

        Each part keeps its structure (:meth:`BiasPart.restrict_keys`); a
        part with nothing in the range is dropped.

        Returns:
            AttentionBias | None: over ``end - start`` keys; None when no part
            has anything in the range.

        Raises:
            ValueError: the range is not inside the keys, or it cuts a
                window grid.
        """
        if not 0 <= start < end <= self.num_keys:
            raise ValueError(f'key range [{start}, {end}) is not inside the {self.num_keys} keys of {self.describe()}')
        parts = [part for part in (part.restrict_keys(start, end) for part in self.parts) if part is not None]
        return AttentionBias(parts, end - start) if parts else None

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'AttentionBias':
        """Move every part; ``dtype`` converts float tensors (masks and indices keep theirs)."""
        return AttentionBias([part.to(device, dtype) for part in self.parts], self.num_keys)

    @property
    def requires_grad(self) -> bool:
        """Whether any part holds a tensor that requires grad."""
        return any(part.requires_grad for part in self.parts)

    @property
    def device(self) -> torch.device:
        """Device of the first part (all parts must share it)."""
        return self.parts[0].device

    def __add__(self, other) -> 'AttentionBias':
        if isinstance(other, Tensor):
            other = DenseBias(other)
        if isinstance(other, BiasPart):
            other = AttentionBias(other, self.num_keys)
        if not isinstance(other, AttentionBias):
            return NotImplemented
        if other.num_keys != self.num_keys:
            raise ValueError(f'cannot add biases over {self.num_keys} and {other.num_keys} keys')
        return AttentionBias(self.parts + other.parts, self.num_keys)

    __radd__ = __add__

    def describe(self) -> str:
        """Short description for logs and error messages."""
        return f'AttentionBias(K={self.num_keys}, parts=[{", ".join(p.describe() for p in self.parts)}])'

    __repr__ = describe


class PerLayer(tuple):
    """One value per decoder layer, e.g. a cross-attention bias with a learned scale per layer.

    Put it in the decoder's ``attn_masks``: ``PETRTransformerDecoder`` hands
    layer ``i`` element ``i`` (and raises when the length differs from its
    number of layers); :func:`restrict_keys` cuts each element to a key range
    and keeps the type. Elements: ``L`` biases over the same ``[Q, K]``
    queries and keys (``AttentionBias``, a ``[..., Q, K]`` tensor or None).
    """


#: one attention call's mask or bias: a structured bias, or a tensor broadcastable to ``[bs, heads, Q, K]`` (bool:
#: True = blocked; float: added to the scores)
LayerBias = Union[Tensor, AttentionBias]
#: a decoder's cross-attention bias: one for every layer, or one per layer (elements None: no bias in that layer)
DecoderBias = Union[LayerBias, PerLayer]


def as_attention_bias(bias, num_keys: Optional[int] = None) -> Optional[AttentionBias]:
    """Normalise what ``apply_attention`` accepts as a bias.

    Args:
        bias (None | Tensor | BiasPart | AttentionBias): a tensor becomes a
            :class:`DenseBias`, a part an :class:`AttentionBias` of one part.
        num_keys (int, optional): K; needed for a bare :class:`WindowBias`,
            otherwise taken from the bias.

    Returns:
        AttentionBias | None
    """
    if bias is None or isinstance(bias, AttentionBias):
        return bias
    if isinstance(bias, Tensor):
        bias = DenseBias(bias)
    if not isinstance(bias, BiasPart):
        raise TypeError(f'bias must be None, a Tensor, a BiasPart or an AttentionBias, got {type(bias).__name__}')
    if num_keys is None:
        num_keys = bias.values.size(-1) if isinstance(bias, DenseBias) else getattr(bias, 'num_keys', None)
        if num_keys is None:
            raise ValueError(f'{bias.describe()} does not know the number of keys: wrap it in '
                             'AttentionBias(parts, num_keys)')
    return AttentionBias(bias, num_keys)


def restrict_keys(bias: Optional[DecoderBias], start: int, end: int) -> Optional[DecoderBias]:
    """A cross-attention bias of any accepted kind over the keys ``[start, end)``, renumbered from 0.

    The fused decoder's keys are ``[BEV tokens ; camera tokens]``; a decoding
    pass over one modality's tokens only needs the bias of exactly those keys.

    Args:
        bias (DecoderBias, optional): a bias over K keys (a tensor:
            ``[..., K]``, a last dim of 1 broadcasts and is kept); a tuple (a
            :class:`PerLayer`: one bias per layer) is restricted element by
            element and keeps its type.
        start (int): first key kept.
        end (int): one past the last key kept, ``start < end <= K``.

    Returns:
        The same kind of bias over ``end - start`` keys; None when nothing of
        it falls in the range (:meth:`AttentionBias.restrict_keys`).
    """
    if bias is None:
        return None
    if isinstance(bias, tuple):
        return type(bias)(restrict_keys(layer_bias, start, end) for layer_bias in bias)
    if isinstance(bias, Tensor):
        return bias if bias.size(-1) == 1 else bias[..., start:end]
    if not isinstance(bias, AttentionBias):
        raise TypeError(f'cannot restrict a {type(bias).__name__} to a key range; expected None, a Tensor, an '
                        f'AttentionBias or a tuple of them (one per decoder layer)')
    return bias.restrict_keys(start, end)
