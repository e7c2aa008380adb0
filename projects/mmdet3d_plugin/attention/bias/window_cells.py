"""Which cells a window around a query covers on a grid of keys, and their key indices.

Pure functions shared by the AQR router's local window attention (the whole
square window, :func:`window_offsets`) and the :class:`~.window.WindowBias`
(the cells of the square with a positive linear decay, :func:`window_stencil`):
both turn per-query centre cells into flattened key indices with
:func:`window_token_index`. The cell lists are made on the host once per
window size and copied to each device once
(:func:`~projects.mmdet3d_plugin.utils.host_data.device_table`, keyed by the
size: a forward asks for them every time), so no shape depends on data and
nothing waits for the device.
"""
import functools
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ...utils.host_data import device_constant, device_table


def check_window_size(window_size: int, name: str = 'window_size') -> int:
    """Validate an odd, positive window size and return it as ``int``."""
    if isinstance(window_size, bool) or int(window_size) != window_size or window_size < 1 or window_size % 2 == 0:
        raise ValueError(f'{name} must be an odd positive integer, got {window_size!r}')
    return int(window_size)


def window_offsets(window_size: int, device: Optional[torch.device] = None) -> Tensor:
    """Cell offsets of a square window (a cached device constant: do not modify it in place).

    Args:
        window_size (int): odd side length.
        device (torch.device, optional): device of the result.

    Returns:
        Tensor: ``[window_size ** 2, 2]`` long ``(dy, dx)`` in row-major order.
    """
    window_size = check_window_size(window_size)
    return device_table(('window_offsets', window_size), lambda: _square_cells(window_size), device)


def _square_cells(window_size: int) -> np.ndarray:
    """``[window_size ** 2, 2]`` int64 ``(dy, dx)`` of a square window, row-major."""
    steps = np.arange(-(window_size // 2), window_size // 2 + 1)
    return np.stack(np.meshgrid(steps, steps, indexing='ij'), axis=-1).reshape(-1, 2)


@functools.lru_cache(maxsize=32)
def _stencil_cells(window_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(dy, dx)`` int64 ``[L, 2]`` and float32 ``decay`` ``[L]`` of :func:`window_stencil` (once per size)."""
    cells = _square_cells(window_size)
    decay = 1.0 - np.sqrt((cells.astype(np.float64) ** 2).sum(-1)) / (window_size / 2.0)
    return cells[decay > 0], decay[decay > 0].astype(np.float32)


def window_stencil(window_size: int, device: Optional[torch.device] = None) -> Tuple[Tensor, Tensor]:
    """The cells of a square window that get a non-zero linear-decay weight (cached device constants).

    Args:
        window_size (int): odd side length ``ws``.
        device (torch.device, optional): device of the results.

    Returns:
        tuple[Tensor, Tensor]: ``offsets`` ``[L, 2]`` long ``(dy, dx)`` and
        ``decay`` ``[L]`` float32: the cells with ``|dy|, |dx| <= ws // 2`` and
        ``decay = 1 - sqrt(dy^2 + dx^2) / (ws / 2) > 0``, row-major.
    """
    window_size = check_window_size(window_size)
    return (device_table(('window_stencil_offsets', window_size), lambda: _stencil_cells(window_size)[0], device),
            device_table(('window_stencil_decay', window_size), lambda: _stencil_cells(window_size)[1], device))


def clamp_to_grid(cells: Tensor, grid_sizes: Sequence[int]) -> Tensor:
    """Integer cells ``[..., A]`` clamped into a grid of ``grid_sizes[a]`` cells along each axis ``a`` (one op)."""
    device, dtype = cells.device, cells.dtype
    return cells.clamp(device_constant([0] * len(grid_sizes), device, dtype),
                       device_constant([int(size) - 1 for size in grid_sizes], device, dtype))


def window_token_index(centers: Tensor,
                       grid_hw: Tuple[int, int],
                       offsets: Tensor,
                       center_valid: Optional[Tensor] = None,
                       plane: Optional[Tensor] = None,
                       first_token: int = 0) -> Tuple[Tensor, Tensor]:
    """Flattened token indices of every query's window cells on a grid.

    Args:
        centers (Tensor): ``[bs, Q, 2]`` integer ``(y, x)`` centre cells.
        grid_hw (tuple[int, int]): ``(H, W)`` of the grid.
        offsets (Tensor): ``[L, 2]`` long ``(dy, dx)`` cells of the window
            (:func:`window_offsets`, :func:`window_stencil`).
        center_valid (Tensor, optional): ``[bs, Q]`` bool; a query whose centre
            is invalid gets no valid token (e.g. invisible to every camera).
        plane (Tensor, optional): ``[bs, Q]`` integer plane (camera view) of
            each centre; the index is then ``plane * H * W + y * W + x``.
        first_token (int): where the grid's tokens start in a memory of several
            grids: added to every index.

    Returns:
        tuple[Tensor, Tensor]: ``index`` ``[bs, Q, L]`` long (``first_token``
        where invalid) and ``valid`` ``[bs, Q, L]`` bool: the cell lies in the
        grid and the centre is valid.
    """
    height, width = (int(s) for s in grid_hw)
    device = centers.device
    cells = centers[..., None, :] + offsets  # [bs, Q, L, 2]
    valid = (clamp_to_grid(cells, (height, width)) == cells).all(-1)  # in the grid: clamping changes nothing
    if center_valid is not None:
        valid = valid & center_valid[..., None]
    index = (cells * device_constant([width, 1], device, torch.long)).sum(-1)
    if plane is not None:
        index = index + (plane[..., None] * (height * width) + first_token)
    elif first_token:
        index = index + first_token
    return torch.where(valid, index, first_token), valid
