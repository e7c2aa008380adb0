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

Every part offers ``to_dense`` for the reference backend, tests and pictures.
Constructors only store tensors and check their shapes (no data-dependent
checks, so no device synchronisation).
"""
import functools
import math
import operator
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..core.host_data import device_constant

_SHAPE_NAMES = ('batch size', 'number of heads', 'number of queries')


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


@dataclass(frozen=True)
class KeyGrid:
    """A block of keys laid out as ``planes x height x width`` cells.

    The key of cell ``(plane, y, x)`` is at index
    ``offset + (plane * height + y) * width + x`` of the key sequence. The BEV
    grid of CMT is ``KeyGrid(0, 1, H_bev, W_bev)``, its camera grid
    ``KeyGrid(H_bev * W_bev, N_views, H_img, W_img)``.
    """

    offset: int
    planes: int
    height: int
    width: int

    def __post_init__(self) -> None:
        object.__setattr__(self, 'offset', _to_int(self.offset, 'KeyGrid.offset', 0))
        for name in ('planes', 'height', 'width'):
            object.__setattr__(self, name, _to_int(getattr(self, name), f'KeyGrid.{name}', 1))

    @property
    def num_cells(self) -> int:
        """Number of keys in the grid."""
        return self.planes * self.height * self.width

    @property
    def end(self) -> int:
        """One past the last key index of the grid."""
        return self.offset + self.num_cells


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

    def check_keys(self, num_keys: int) -> None:
        """Raise ValueError if the part does not fit ``num_keys`` keys."""
        raise NotImplementedError

    def to_dense(self, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """The part as a tensor ``[bs | 1, heads | 1, Q | 1, num_keys]``."""
        raise NotImplementedError

    def select_queries(self, batch: int, queries: Tensor) -> 'BiasPart':
        """The part restricted to sample ``batch`` and the given query indices (batch size 1)."""
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

    def select_queries(self, batch: int, queries: Tensor) -> 'SegmentBias':
        return SegmentBias(self.values[batch:batch + 1, :, queries], self.segment_lengths)

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'SegmentBias':
        return SegmentBias(_float_to(self.values, device, dtype), self.segment_lengths)

    def tensors(self) -> Tuple[Tensor, ...]:
        return (self.values, )

    def describe(self) -> str:
        return (f'SegmentBias(bs={self.batch_size}, heads={self.num_heads}, Q={self.num_queries}, '
                f'segments={self.segment_lengths})')


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

    def select_queries(self, batch: int, queries: Tensor) -> 'LowRankBias':
        key_factor = self.key_factor if self.key_factor.size(0) == 1 else self.key_factor[batch:batch + 1]
        return LowRankBias(self.query_factor[batch:batch + 1, :, queries], key_factor)

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'LowRankBias':
        return LowRankBias(_float_to(self.query_factor, device, dtype), _float_to(self.key_factor, device, dtype))

    def tensors(self) -> Tuple[Tensor, ...]:
        return self.query_factor, self.key_factor

    def describe(self) -> str:
        return (f'LowRankBias(bs={self.batch_size}, heads={self.num_heads}, Q={self.num_queries}, '
                f'rank={self.rank})')


@functools.lru_cache(maxsize=32)
def _stencil_cells(window_size: int) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[float, ...]]:
    """``dy``, ``dx`` and ``decay`` of :func:`window_stencil` as Python numbers (computed once per size)."""
    radius = window_size // 2
    cells = [(y, x, 1.0 - math.sqrt(y * y + x * x) / (window_size / 2.0))
             for y in range(-radius, radius + 1) for x in range(-radius, radius + 1)]
    dy, dx, decay = zip(*[cell for cell in cells if cell[2] > 0])
    return dy, dx, decay


def window_stencil(window_size: int, device=None) -> Tuple[Tensor, Tensor, Tensor]:
    """The cells of a square window that get a non-zero linear-decay weight.

    The cells are chosen on the host and copied to each device once
    (:func:`~projects.mmdet3d_plugin.core.host_data.device_constant`), so building the stencil has
    no data-dependent shape and no device synchronisation (the same code runs,
    and traces under ``FakeTensorMode``, on every device).

    Args:
        window_size (int): odd side length ``ws``.
        device (torch.device, optional): device of the results.

    Returns:
        tuple[Tensor, Tensor, Tensor]: ``dy``, ``dx`` (long) and ``decay``
        (float32), each ``[L]``: the cells with ``|dy|, |dx| <= ws // 2`` and
        ``decay = 1 - sqrt(dy^2 + dx^2) / (ws / 2) > 0``, row-major.
    """
    dy, dx, decay = _stencil_cells(window_size)
    return (device_constant(dy, device, torch.long), device_constant(dx, device, torch.long),
            device_constant(decay, device, torch.float32))


class WindowKeys:
    """The keys a :class:`WindowBias` touches, gathered per query.

    Attributes:
        index (Tensor): ``[bs, Q, L]`` long key indices (a valid key where
            the slot is unused).
        valid (Tensor): ``[bs, Q, L]`` bool, False for cells outside the grid
            and for queries whose centre is invalid.
        weight (Tensor): ``[bs, heads | 1, Q, L]`` float bias of each slot
            (0 where not valid); differentiable w.r.t. the amplitudes.
    """

    def __init__(self, index: Tensor, valid: Tensor, weight: Tensor) -> None:
        self.index, self.valid, self.weight = index, valid, weight


class WindowBias(BiasPart):
    """Linearly decaying square windows around per-query centres on key grids (the AQR local bias).

    For each grid ``g`` and query ``q`` with ``valid[q]``, the key of cell
    ``(plane, y, x)`` gets
    ``amplitude[q] * max(0, 1 - d / (window_size / 2))`` when ``plane`` is the
    centre's plane and ``|dy|, |dx| <= window_size // 2``, with ``d`` the
    Euclidean distance in cells to the centre; every other key gets 0. Windows
    are clipped at the grid borders. Grids must not overlap.

    Args:
        grids (KeyGrid | Sequence[KeyGrid]): the key grids.
        centres (Tensor | Sequence[Tensor]): per grid ``[bs, Q, 3]`` integer
            ``(plane, y, x)`` centre cell of every query.
        valid (Tensor | Sequence[Tensor]): per grid ``[bs, Q]`` bool; an
            invalid query (e.g. visible in no camera) gets no bias on that grid.
        amplitude (Tensor | Sequence[Tensor]): per grid ``[bs, heads | 1, Q]``
            float bias at the centre (differentiable). Must be finite: hard
            masks belong in ``key_padding_mask`` or a :class:`DenseBias`.
        window_size (int | Sequence[int]): odd side length, one for all grids
            or one per grid.
    """

    def __init__(self,
                 grids: Union[KeyGrid, Sequence[KeyGrid]],
                 centres: Union[Tensor, Sequence[Tensor]],
                 valid: Union[Tensor, Sequence[Tensor]],
                 amplitude: Union[Tensor, Sequence[Tensor]],
                 window_size: Union[int, Sequence[int]]) -> None:
        single = isinstance(grids, KeyGrid)
        self.grids = (grids, ) if single else tuple(grids)
        self.centres = (centres, ) if single else tuple(centres)
        self.valid = (valid, ) if single else tuple(valid)
        self.amplitude = (amplitude, ) if single else tuple(amplitude)
        if isinstance(window_size, (list, tuple)):
            self.window_size = tuple(window_size)
        else:
            self.window_size = (window_size, ) * len(self.grids)
        lengths = {len(self.grids), len(self.centres), len(self.valid), len(self.amplitude), len(self.window_size)}
        if len(lengths) != 1 or not self.grids:
            raise ValueError('WindowBias needs one centres / valid / amplitude / window_size entry per grid and at '
                             f'least one grid; got {len(self.grids)} grids, {len(self.centres)} centres, '
                             f'{len(self.valid)} valid, {len(self.amplitude)} amplitudes, '
                             f'{len(self.window_size)} window sizes')
        for grid in self.grids:
            if not isinstance(grid, KeyGrid):
                raise TypeError(f'WindowBias grids must be KeyGrid, got {type(grid).__name__}')
        self.window_size = tuple(_to_int(ws, 'window_size', 1) for ws in self.window_size)
        if any(ws % 2 == 0 for ws in self.window_size):
            raise ValueError(f'window_size must be odd, got {self.window_size}')
        self._check_shapes()
        check_disjoint_grids(self.grids)

    def _check_shapes(self) -> None:
        sizes = None
        heads = {1}
        for i, (centres, valid, amplitude) in enumerate(zip(self.centres, self.valid, self.amplitude)):
            _check_tensor(centres, f'WindowBias.centres[{i}]', 3, 'int')
            _check_tensor(valid, f'WindowBias.valid[{i}]', 2, 'bool')
            _check_tensor(amplitude, f'WindowBias.amplitude[{i}]', 3, 'float')
            if centres.size(-1) != 3:
                raise ValueError(f'WindowBias.centres[{i}] must be [bs, Q, 3] (plane, y, x), got '
                                 f'{tuple(centres.shape)}')
            bs_q = tuple(centres.shape[:2])
            if tuple(valid.shape) != bs_q or (amplitude.size(0), amplitude.size(2)) != bs_q:
                raise ValueError(f'WindowBias grid {i}: centres {tuple(centres.shape)}, valid {tuple(valid.shape)} '
                                 f'and amplitude {tuple(amplitude.shape)} disagree on [bs, Q]')
            if sizes is not None and bs_q != sizes:
                raise ValueError(f'WindowBias grid {i} has [bs, Q] = {bs_q}, grid 0 has {sizes}')
            sizes = bs_q
            heads.add(amplitude.size(1))
        if len(heads) > 2:
            raise ValueError(f'WindowBias amplitudes have incompatible head counts {sorted(heads)}')
        self.batch_size, self.num_queries = (int(s) for s in sizes)
        self.num_heads = int(max(heads))

    def check_keys(self, num_keys: int) -> None:
        for grid in self.grids:
            if grid.end > num_keys:
                raise ValueError(f'WindowBias grid {grid} ends at key {grid.end}, the attention has {num_keys} keys')

    def window_keys(self) -> WindowKeys:
        """Gather, per query, the keys inside its windows on every grid (``L = sum of stencil sizes``)."""
        indices, valids, weights = [], [], []
        for grid, centres, valid, amplitude, window_size in zip(self.grids, self.centres, self.valid,
                                                                 self.amplitude, self.window_size):
            dy, dx, decay = window_stencil(window_size, centres.device)
            radius = window_size // 2
            steps = torch.arange(-radius, radius + 1, device=centres.device)
            plane, y, x = centres.unbind(-1)
            # in-grid tests per stencil row / column ([bs, Q, ws]), then picked per cell: few [bs, Q, L] passes
            rows = y[..., None] + steps
            cols = x[..., None] + steps
            row_inside = (rows >= 0) & (rows < grid.height)
            col_inside = (cols >= 0) & (cols < grid.width)
            query_inside = valid & (plane >= 0) & (plane < grid.planes)
            inside = row_inside[..., dy + radius] & col_inside[..., dx + radius] & query_inside[..., None]
            centre_key = grid.offset + (plane * grid.height + y) * grid.width + x
            index = centre_key[..., None] + (dy * grid.width + dx)
            indices.append(torch.where(inside, index, grid.offset))
            valids.append(inside)
            weights.append(amplitude[..., None] * (decay.to(amplitude.dtype) * inside)[:, None])
        heads = max(w.size(1) for w in weights)
        weights = [w.expand(-1, heads, -1, -1) for w in weights]
        if len(indices) == 1:
            return WindowKeys(indices[0], valids[0], weights[0])
        return WindowKeys(torch.cat(indices, -1), torch.cat(valids, -1), torch.cat(weights, -1))

    def to_dense(self, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
        self.check_keys(num_keys)
        keys = self.window_keys()
        bs, heads, num_queries, length = keys.weight.shape
        dense = keys.weight.new_zeros(bs, heads, num_queries, num_keys)
        dense = dense.scatter_add(-1, keys.index[:, None].expand(bs, heads, num_queries, length), keys.weight)
        return dense.to(dtype)

    def select_queries(self, batch: int, queries: Tensor) -> 'WindowBias':
        return WindowBias(self.grids, [c[batch:batch + 1, queries] for c in self.centres],
                          [v[batch:batch + 1, queries] for v in self.valid],
                          [a[batch:batch + 1, :, queries] for a in self.amplitude], self.window_size)

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'WindowBias':
        return WindowBias(self.grids, [c.to(device) for c in self.centres], [v.to(device) for v in self.valid],
                          [_float_to(a, device, dtype) for a in self.amplitude], self.window_size)

    def tensors(self) -> Tuple[Tensor, ...]:
        return self.centres + self.valid + self.amplitude

    def describe(self) -> str:
        grids = ', '.join(f'{g.planes}x{g.height}x{g.width}@{g.offset} ws={ws}'
                          for g, ws in zip(self.grids, self.window_size))
        return f'WindowBias(bs={self.batch_size}, heads={self.num_heads}, Q={self.num_queries}, grids=[{grids}])'


def check_disjoint_grids(grids: Iterable[KeyGrid]) -> None:
    """Raise ValueError if two key grids share keys."""
    ordered = sorted(grids, key=lambda g: g.offset)
    for left, right in zip(ordered[:-1], ordered[1:]):
        if left.end > right.offset:
            raise ValueError(f'key grids {left} and {right} overlap')


class DenseBias(BiasPart):
    """An unstructured bias tensor.

    Args:
        values (Tensor): broadcastable to ``[bs, heads, Q, K]`` (up to 4 dims,
            missing leading dims count as 1). Float: added to the scores; bool:
            True = blocked.
    """

    broadcast_dims = (0, 1, 2)

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

    def select_queries(self, batch: int, queries: Tensor) -> 'DenseBias':
        values = self.values[batch:batch + 1] if self.batch_size > 1 else self.values
        return DenseBias(values[:, :, queries] if self.num_queries > 1 else values)

    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> 'DenseBias':
        return DenseBias(self.values.to(device) if self.is_mask else _float_to(self.values, device, dtype))

    def tensors(self) -> Tuple[Tensor, ...]:
        return (self.values, )

    def describe(self) -> str:
        kind = 'bool mask' if self.is_mask else str(self.values.dtype).replace('torch.', '')
        return f'DenseBias({kind}, shape={tuple(self.values.shape)})'


class AttentionBias:
    """A structured additive attention bias: the sum of its parts.

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
