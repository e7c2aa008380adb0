"""The :class:`WindowBias`: per query, a linearly decaying window around a centre cell on key grids (the AQR
local bias) and its window keys (the cells: :mod:`.window_cells`)."""
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .key_grid import KeyGrid
from .part import BiasPart, ScoreTerm, _check_tensor, _float_to, _to_int
from .window_cells import window_stencil, window_token_index


def has_window(grid: KeyGrid, centres: Tensor, valid: Tensor) -> Tensor:
    """``[bs, Q]`` bool: the query gets a window on ``grid``: it is valid and its centre ``[bs, Q, 3]`` lies on one of
    the grid's planes."""
    plane = centres[..., 0]
    return valid & (plane >= 0) & (plane < grid.planes)


def cat_slots(pieces: Sequence[Tensor]) -> Tensor:
    """Per-window (or per-grid) slot tensors ``[..., L_i]`` side by side on the slot dim (no copy for one)."""
    return pieces[0] if len(pieces) == 1 else torch.cat(list(pieces), -1)


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

    is_window = True

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
        self._slots = None

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
        """Gather, per query, the keys inside its windows on every grid (``L = sum of stencil sizes``).

        The slots (indices, validity, decay) depend on the centres alone and
        are computed once per bias (the decoder layers share one); the
        weights, which carry the amplitudes' gradients, on every call.
        """
        if self._slots is None:
            self._slots = self._window_slots()
        index, valid, decays = self._slots
        weights = [amplitude[..., None] * decay.to(amplitude.dtype)[:, None]
                   for amplitude, decay in zip(self.amplitude, decays)]
        heads = max(w.size(1) for w in weights)
        return WindowKeys(index, valid, cat_slots([w.expand(-1, heads, -1, -1) for w in weights]))

    def _window_slots(self) -> Tuple[Tensor, Tensor, List[Tensor]]:
        """The window slots of every query: ``index`` and ``valid`` ``[bs, Q, L]`` and per grid the float32 decay
        ``[bs, Q, L_g]`` of each slot (0 where not valid)."""
        indices, valids, decays = [], [], []
        for grid, centres, valid, window_size in zip(self.grids, self.centres, self.valid, self.window_size):
            offsets, decay = window_stencil(window_size, centres.device)
            # on a one-plane grid a centre with a window is on plane 0: its plane adds nothing to the index
            index, inside = window_token_index(centres[..., 1:], (grid.height, grid.width), offsets,
                                               has_window(grid, centres, valid),
                                               centres[..., 0] if grid.planes > 1 else None, first_token=grid.offset)
            indices.append(index)
            valids.append(inside)
            decays.append(decay * inside)
        return cat_slots(indices), cat_slots(valids), decays

    def to_dense(self, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
        self.check_keys(num_keys)
        keys = self.window_keys()
        bs, heads, num_queries, length = keys.weight.shape
        dense = keys.weight.new_zeros(bs, heads, num_queries, num_keys)
        dense = dense.scatter_add(-1, keys.index[:, None].expand(bs, heads, num_queries, length), keys.weight)
        return dense.to(dtype)

    def score_term(self, shape: Tuple[int, int, int, int], rows: Tensor) -> ScoreTerm:
        """The decay of every grid's window from the query's centre cell and the key's cell (no gathered keys)."""
        bs, heads = shape[:2]
        grids = [(grid, centres.index_select(1, rows), valid.index_select(1, rows),
                  amplitude.expand(bs, heads, -1).index_select(2, rows), window_size)
                 for grid, centres, valid, amplitude, window_size in zip(self.grids, self.centres, self.valid,
                                                                          self.amplitude, self.window_size)]

        def term(b, h, q_idx, kv_idx):
            total = 0.0
            for grid, centres, valid, amplitude, window_size in grids:
                local = kv_idx - grid.offset
                cell = local % (grid.height * grid.width)
                dy = cell // grid.width - centres[b, q_idx, 1]
                dx = cell % grid.width - centres[b, q_idx, 2]
                radius = window_size // 2
                plane = local // (grid.height * grid.width)
                hit = ((local >= 0) & (local < grid.num_cells) & (plane == centres[b, q_idx, 0])
                       & (dy.abs() <= radius) & (dx.abs() <= radius) & valid[b, q_idx])
                decay = torch.clamp(1.0 - torch.sqrt((dy * dy + dx * dx).float()) / (window_size / 2.0), min=0.0)
                total = total + torch.where(hit, amplitude[b, h, q_idx] * decay, 0.0)
            return total

        return term

    def select_queries(self, batch: int, queries: Tensor) -> 'WindowBias':
        selected = WindowBias(self.grids, [c[batch:batch + 1, queries] for c in self.centres],
                              [v[batch:batch + 1, queries] for v in self.valid],
                              [a[batch:batch + 1, :, queries] for a in self.amplitude], self.window_size)
        if self._slots is not None:  # the selected queries' slots, taken from the whole bias's instead of rebuilt
            index, valid, decays = self._slots
            selected._slots = (index[batch:batch + 1, queries], valid[batch:batch + 1, queries],
                               [decay[batch:batch + 1, queries] for decay in decays])
        return selected

    def restrict_keys(self, start: int, end: int) -> Optional['WindowBias']:
        """The key grids inside the range, moved by ``-start``; a grid that straddles a range end raises
        ValueError (a window cannot be cut)."""
        kept = []
        for index, grid in enumerate(self.grids):
            if grid.offset >= start and grid.end <= end:
                kept.append(index)
            elif grid.offset < end and grid.end > start:
                raise ValueError(f'key range [{start}, {end}) cuts the window grid {grid} of {self.describe()}')
        if not kept:
            return None
        grids = [self.grids[i] for i in kept]
        return WindowBias([KeyGrid(g.offset - start, g.planes, g.height, g.width) for g in grids],
                          [self.centres[i] for i in kept], [self.valid[i] for i in kept],
                          [self.amplitude[i] for i in kept], [self.window_size[i] for i in kept])

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
