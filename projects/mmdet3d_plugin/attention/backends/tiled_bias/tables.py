"""The bias of a ``tiled_bias`` call as its kernels read it: per key its cell and segment, per query its window
centres (pure functions of the bias and the call's shapes; no Triton)."""
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ....utils.host_data import device_constant, device_table
from ...bias import KeyGrid, WindowBias
from ...bias.window import has_window


class TileBiasTables:
    """The shape data of one call's bias (the differentiable amplitudes and segment values travel separately).

    Attributes:
        keys (Tensor): ``[5, K]`` int32 contiguous: per key its grid id (-1:
            on no grid), plane, row, column, and segment id (-1 without a
            segment term).
        centres (Tensor): ``[G, bs, Q, 3]`` int32 ``(plane, y, x)`` centre
            cell of every query on every grid, plane -1 where the query has no
            window there.
        inv_half (Tensor): ``[G]`` float32 ``2 / window_size`` per grid.
        num_segments (int): S (0: no segment term).
        padding (Tensor | None): ``[bs, K]`` uint8, 1 at padded keys.
    """

    def __init__(self, keys: Tensor, centres: Tensor, inv_half: Tensor, num_segments: int,
                 padding: Optional[Tensor]) -> None:
        self.keys, self.centres, self.inv_half = keys, centres, inv_half
        self.num_segments, self.padding = num_segments, padding

    @property
    def num_grids(self) -> int:
        """G, the window grids (0: no window term)."""
        return self.centres.size(0)


def key_cells(grids: Sequence[KeyGrid], segment_bounds: Optional[Sequence[Tuple[int, int]]], num_keys: int,
              device: torch.device) -> Tensor:
    """Where every key lies: ``[5, K]`` int32 rows grid id, plane, y, x, segment id.

    A function of the shapes alone: made on the host once per (grids, segments, K) and copied to each device
    once (:func:`~projects.mmdet3d_plugin.utils.host_data.device_table`), so a call launches nothing for it.

    Args:
        grids (Sequence[KeyGrid]): disjoint key grids; grid ``g`` gets id ``g``.
        segment_bounds (Sequence[tuple[int, int]], optional): the key range of
            segment ``s`` gets id ``s``; None: every key -1.
        num_keys (int): K.
        device (torch.device): device of the table.

    Returns:
        Tensor: ``[5, K]`` int32 (a cached table: do not modify it in place); a key on no grid has grid id -1
        (and plane, y, x 0).
    """
    grids = tuple(grids)
    bounds = None if segment_bounds is None else tuple((int(start), int(end)) for start, end in segment_bounds)
    return device_table(('tiled_bias_key_cells', grids, bounds, int(num_keys)),
                        lambda: _host_key_cells(grids, bounds, num_keys), device)


def _host_key_cells(grids: Sequence[KeyGrid], segment_bounds: Optional[Sequence[Tuple[int, int]]],
                    num_keys: int) -> np.ndarray:
    """:func:`key_cells`' table, on the host."""
    cells = np.zeros((5, num_keys), dtype=np.int32)
    cells[0] = -1
    for index, grid in enumerate(grids):
        cells[0, grid.offset:grid.end] = index
        cells[1:4, grid.offset:grid.end] = np.unravel_index(np.arange(grid.num_cells),
                                                            (grid.planes, grid.height, grid.width))
    cells[4] = -1
    for index, (start, end) in enumerate(segment_bounds or ()):
        cells[4, start:end] = index
    return cells


def window_centres(windows: Sequence[WindowBias]) -> Tuple[List[KeyGrid], Tensor, Tensor]:
    """The grids of the window parts (at least one), each query's centre cell on each, and ``2 / window_size`` per grid.

    Returns:
        tuple: the grids (in order: part by part, grid by grid), ``[G, bs, Q, 3]``
        int32 centres with plane -1 where the query is not valid or its plane
        is off the grid (no window: the window bias gives it nothing there),
        and ``[G]`` float32 ``2 / window_size``.
    """
    grids, centres, inv_half = [], [], []
    for part in windows:
        for grid, centre, valid, window_size in zip(part.grids, part.centres, part.valid, part.window_size):
            windowed = has_window(grid, centre, valid)
            centre = torch.cat([torch.where(windowed, centre[..., 0], -1)[..., None], centre[..., 1:]], -1)
            grids.append(grid)
            centres.append(centre.to(torch.int32))
            inv_half.append(2.0 / window_size)
    return grids, torch.stack(centres), device_constant(tuple(inv_half), centres[0].device, torch.float32)
