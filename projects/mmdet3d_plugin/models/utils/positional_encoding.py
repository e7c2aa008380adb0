"""Pure functions for CMT's coordinate encodings (BEV grid, sine embedding, camera frustums).

Every function here is geometry only: no parameters, no module state, all
sizes read from the arguments. The learned parts (``bev_embedding``,
``rv_embedding``) live in the head and are applied to what these return.
"""
import math
from typing import Sequence, Tuple

import torch

from ...utils.host_data import device_constant

def pos2embed(pos: torch.Tensor, num_pos_feats: int = 128) -> torch.Tensor:
    """Sine/cosine embedding of the first two coordinates of ``pos``.

    The frequencies are those of upstream CMT, ``1 + 2 * floor(i / 2) / F`` for
    feature ``i`` of ``F = num_pos_feats`` (not DETR's ``temperature ** ...``);
    they are kept so that published checkpoints see the inputs they were
    trained on. Even features take ``sin``, odd ones ``cos``.

    Args:
        pos (Tensor): ``[..., >=2]`` coordinates normalised to ``[0, 1]``;
            only ``pos[..., 0]`` (x) and ``pos[..., 1]`` (y) are used.
        num_pos_feats (int): features per coordinate.

    Returns:
        Tensor: ``[..., 2 * num_pos_feats]``, the y embedding then the x one.
    """
    if pos.size(-1) < 2:
        raise ValueError(f'pos2embed needs at least 2 coordinates in the last dim, got shape {tuple(pos.shape)}')
    pos = pos * (2 * math.pi)
    dim_t = torch.arange(num_pos_feats, dtype=torch.float32, device=pos.device)
    dim_t = 2 * torch.div(dim_t, 2, rounding_mode='floor') / num_pos_feats + 1

    def _embed(coord: torch.Tensor) -> torch.Tensor:
        scaled = coord[..., None] / dim_t
        return torch.stack((scaled[..., 0::2].sin(), scaled[..., 1::2].cos()), dim=-1).flatten(-2)

    return torch.cat((_embed(pos[..., 1]), _embed(pos[..., 0])), dim=-1)


def bev_grid_coords(height: int, width: int, device: torch.device = None) -> torch.Tensor:
    """Normalised centres of the cells of a ``height x width`` BEV feature map.

    Args:
        height (int): rows of the BEV map (y direction).
        width (int): columns of the BEV map (x direction).
        device (torch.device, optional): device of the result.

    Returns:
        Tensor: ``[height * width, 2]`` ``(x, y)`` in ``(0, 1)``, row-major
        (the order of ``feat.flatten(2)`` for a ``[bs, C, H, W]`` map).
    """
    ys = (torch.arange(height, dtype=torch.float32, device=device) + 0.5) / height
    xs = (torch.arange(width, dtype=torch.float32, device=device) + 0.5) / width
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing='ij')
    return torch.stack((grid_x, grid_y), dim=-1).reshape(-1, 2)


def normalize_points(points: torch.Tensor, pc_range: Sequence[float]) -> torch.Tensor:
    """Map metric ``(x, y, z)`` to ``[0, 1]`` inside ``pc_range`` (not clamped).

    Args:
        points (Tensor): ``[..., 3]`` metric coordinates.
        pc_range (Sequence[float]): ``(x_min, y_min, z_min, x_max, y_max, z_max)``.

    Returns:
        Tensor: ``[..., 3]``.
    """
    low = device_constant(pc_range[:3], points.device, points.dtype)
    high = device_constant(pc_range[3:6], points.device, points.dtype)
    return (points - low) / (high - low)


def denormalize_points(points: torch.Tensor, pc_range: Sequence[float]) -> torch.Tensor:
    """Inverse of :func:`normalize_points`: ``[..., 3]`` in ``[0, 1]`` to metres."""
    low = device_constant(pc_range[:3], points.device, points.dtype)
    high = device_constant(pc_range[3:6], points.device, points.dtype)
    return points * (high - low) + low


def depth_bins(depth_num: int, depth_max: float, device: torch.device = None) -> torch.Tensor:
    """CMT's camera depth samples ``1 + i * (depth_max - 1) / depth_num``.

    Args:
        depth_num (int): number of depths D.
        depth_max (float): upper end (CMT uses ``pc_range[3]``).
        device (torch.device, optional): device of the result.

    Returns:
        Tensor: ``[D]`` depths in metres.
    """
    return 1 + torch.arange(depth_num, dtype=torch.float32, device=device) * (depth_max - 1) / depth_num


def image_frustum_points(feat_hw: Tuple[int, int], pad_hw: Tuple[float, float],
                         depths: torch.Tensor) -> torch.Tensor:
    """Homogeneous image-space frustum points of a feature map.

    Feature cell ``(i, j)`` sits at pixel ``(u, v) = (j * pad_w / W, i * pad_h / H)``;
    each is lifted to every depth ``d`` as ``(u * d, v * d, d, 1)`` so that
    multiplying by ``inverse(lidar2img)`` gives a LiDAR point.

    Args:
        feat_hw (tuple[int, int]): feature map size ``(H, W)``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)`` in pixels.
        depths (Tensor): ``[D]`` depths.

    Returns:
        Tensor: ``[H, W, D, 4]``.
    """
    feat_h, feat_w = feat_hw
    pad_h, pad_w = pad_hw
    device = depths.device
    vs = torch.arange(feat_h, dtype=torch.float32, device=device) * pad_h / feat_h
    us = torch.arange(feat_w, dtype=torch.float32, device=device) * pad_w / feat_w
    grid_v, grid_u, grid_d = torch.meshgrid(vs, us, depths, indexing='ij')
    return torch.stack((grid_u * grid_d, grid_v * grid_d, grid_d, torch.ones_like(grid_d)), dim=-1)
