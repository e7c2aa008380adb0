"""Pure functions that turn 3D boxes into per-view 2D targets of a camera feature map.

Used by :class:`ImageAuxHead` (centre heatmaps and object depths) and by the
depth-aware camera position of :class:`CmtHead` (cell centres lifted to 3D).

Conventions: a view's image is ``pad_hw = (pad_h, pad_w)`` pixels and its
feature map ``feat_hw = (h, w)`` cells, so a cell is ``pad_h / h`` by
``pad_w / w`` pixels; cell ``(i, j)`` covers pixels ``[j * sx, (j + 1) * sx)``
horizontally and has its centre at ``((j + 0.5) * sx, (i + 0.5) * sy)``. Depth
is the camera ``z`` (third row of ``lidar2img``) in metres; only points deeper
than ``min_depth`` count as in front of the camera.
"""
from typing import Tuple

import torch
from torch import Tensor

from .camera_geometry import lift_pixels, project_to_views


def feature_cell_centres(feat_hw: Tuple[int, int], pad_hw: Tuple[float, float],
                         device: torch.device = None) -> Tensor:
    """Pixel centres of the cells of a feature map.

    Args:
        feat_hw (tuple[int, int]): feature map size ``(h, w)``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)``.
        device (torch.device, optional): device of the result.

    Returns:
        Tensor: ``[h, w, 2]`` ``(u, v)`` in pixels.
    """
    feat_h, feat_w = feat_hw
    pad_h, pad_w = pad_hw
    vs = (torch.arange(feat_h, dtype=torch.float32, device=device) + 0.5) * (pad_h / feat_h)
    us = (torch.arange(feat_w, dtype=torch.float32, device=device) + 0.5) * (pad_w / feat_w)
    grid_v, grid_u = torch.meshgrid(vs, us, indexing='ij')
    return torch.stack((grid_u, grid_v), dim=-1)


def lift_cell_centres(cell_depth: Tensor, img2lidar: Tensor, pad_hw: Tuple[float, float]) -> Tensor:
    """Back-project every feature cell's pixel centre to LiDAR coordinates at its own depth.

    Args:
        cell_depth (Tensor): ``[M, h, w]`` camera depth in metres (M = views of the batch).
        img2lidar (Tensor): ``[M, 4, 4]``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)``.

    Returns:
        Tensor: ``[M, h, w, 3]`` metric LiDAR coordinates.
    """
    feat_hw = cell_depth.shape[-2:]
    centres = feature_cell_centres(feat_hw, pad_hw, cell_depth.device)
    pixels = torch.cat((centres, torch.ones_like(centres[..., :1])), dim=-1) * cell_depth[..., None]
    unit_depth = torch.ones(1, dtype=pixels.dtype, device=pixels.device)
    points = lift_pixels(pixels.flatten(1, 2)[:, None], unit_depth, img2lidar[:, None])
    return points[:, 0, :, 0].unflatten(1, feat_hw)


def project_points(points: Tensor, lidar2img: Tensor, pad_hw: Tuple[float, float],
                   min_depth: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Project LiDAR points into every view of one sample.

    Args:
        points (Tensor): ``[n, 3]`` metric LiDAR coordinates.
        lidar2img (Tensor): ``[N, 4, 4]``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)``.
        min_depth (float): points at most this deep are behind the camera.

    Returns:
        tuple[Tensor, Tensor, Tensor]:
            - ``pixels`` ``[N, n, 2]``: ``(u, v)`` (meaningless where not in front).
            - ``depth`` ``[N, n]``: camera ``z`` in metres.
            - ``visible`` ``[N, n]`` bool: deeper than ``min_depth`` and inside the image.
    """
    image_points, inside = project_to_views(points[None], lidar2img[None], pad_hw)
    homogeneous = torch.cat((points, torch.ones_like(points[:, :1])), dim=-1)
    depth = torch.einsum('nd,vd->vn', homogeneous, lidar2img[:, 2])
    return image_points[0, ..., :2], depth, inside[0] & (depth > min_depth)


def project_box_centres(centres: Tensor, lidar2img: Tensor, pad_hw: Tuple[float, float],
                        min_depth: float) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`project_points` of the boxes' gravity centres ``[n, 3]``: ``pixels``, ``depth``, ``visible``."""
    return project_points(centres, lidar2img, pad_hw, min_depth)


def project_box_extents(corners: Tensor, lidar2img: Tensor, pad_hw: Tuple[float, float],
                        min_depth: float) -> Tuple[Tensor, Tensor]:
    """2D boxes of the projected corners, clipped to the image.

    Only the corners in front of the camera (deeper than ``min_depth``) span
    the box; a box with none, or empty once clipped, is not valid.

    Args:
        corners (Tensor): ``[n, 8, 3]`` metric LiDAR coordinates.
        lidar2img (Tensor): ``[N, 4, 4]``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)``.
        min_depth (float): see :func:`project_points`.

    Returns:
        tuple[Tensor, Tensor]:
            - ``boxes`` ``[N, n, 4]``: ``(x1, y1, x2, y2)`` in pixels, inside
              ``[0, pad_w] x [0, pad_h]``.
            - ``valid`` ``[N, n]`` bool.
    """
    num_boxes = corners.size(0)
    pixels, depth, _ = project_points(corners.reshape(-1, 3), lidar2img, pad_hw, min_depth)
    pixels = pixels.unflatten(1, (num_boxes, 8))
    in_front = (depth > min_depth).unflatten(1, (num_boxes, 8))[..., None]
    low = torch.where(in_front, pixels, torch.full_like(pixels, float('inf'))).amin(dim=2)
    high = torch.where(in_front, pixels, torch.full_like(pixels, float('-inf'))).amax(dim=2)
    pad_h, pad_w = pad_hw
    x1, x2 = low[..., 0].clamp(0, pad_w), high[..., 0].clamp(0, pad_w)
    y1, y2 = low[..., 1].clamp(0, pad_h), high[..., 1].clamp(0, pad_h)
    valid = in_front.any(dim=2)[..., 0] & (x2 > x1) & (y2 > y1)
    return torch.stack((x1, y1, x2, y2), dim=-1), valid


def gaussian_radius(height: Tensor, width: Tensor, min_overlap: float) -> Tensor:
    """CenterNet's Gaussian radius (the formula of mmdet3d's ``gaussian_radius``), element-wise.

    Args:
        height (Tensor): box heights ``[...]`` (any unit; the radius has it too).
        width (Tensor): box widths ``[...]``.
        min_overlap (float): IoU a box shifted by the radius keeps with the target.

    Returns:
        Tensor: ``[...]`` radii.
    """
    size_sum, area = height + width, height * width
    b1, c1 = size_sum, area * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + torch.sqrt(b1 ** 2 - 4 * c1)) / 2
    b2, c2 = 2 * size_sum, (1 - min_overlap) * area
    r2 = (b2 + torch.sqrt(b2 ** 2 - 16 * c2)) / 2
    a3, b3, c3 = 4 * min_overlap, -2 * min_overlap * size_sum, (min_overlap - 1) * area
    r3 = (b3 + torch.sqrt(b3 ** 2 - 4 * a3 * c3)) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


def centre_heatmap_targets(pixels: Tensor, boxes: Tensor, visible: Tensor, labels: Tensor, num_classes: int,
                           feat_hw: Tuple[int, int], pad_hw: Tuple[float, float], min_overlap: float = 0.1,
                           min_radius: int = 1) -> Tensor:
    """CenterNet heatmaps of the projected box centres.

    Each visible centre puts a Gaussian, peak 1, on the cell that contains it,
    in its class's channel; the radius ``r`` is :func:`gaussian_radius` of its
    2D box measured in cells (at least ``min_radius``), ``sigma = (2r + 1) / 6``,
    cut to the ``(2r + 1)^2`` window; overlapping Gaussians keep the maximum.

    Args:
        pixels (Tensor): ``[N, n, 2]`` projected centres (:func:`project_box_centres`).
        boxes (Tensor): ``[N, n, 4]`` 2D boxes (:func:`project_box_extents`).
        visible (Tensor): ``[N, n]`` bool: which centres count.
        labels (Tensor): ``[n]`` class indices in ``[0, num_classes)``.
        num_classes (int): heatmap channels K.
        feat_hw (tuple[int, int]): feature map size ``(h, w)``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)``.
        min_overlap (float): see :func:`gaussian_radius`.
        min_radius (int): smallest radius in cells.

    Returns:
        Tensor: ``[N, K, h, w]`` in ``[0, 1]``.
    """
    feat_h, feat_w = feat_hw
    stride_y, stride_x = pad_hw[0] / feat_h, pad_hw[1] / feat_w
    cell_x = torch.div(pixels[..., 0], stride_x, rounding_mode='floor').clamp(0, feat_w - 1)
    cell_y = torch.div(pixels[..., 1], stride_y, rounding_mode='floor').clamp(0, feat_h - 1)
    box_h = (boxes[..., 3] - boxes[..., 1]) / stride_y
    box_w = (boxes[..., 2] - boxes[..., 0]) / stride_x
    radius = gaussian_radius(box_h, box_w, min_overlap).floor().clamp(min=min_radius)[..., None, None]
    sigma = (2 * radius + 1) / 6
    dx = torch.arange(feat_w, dtype=pixels.dtype, device=pixels.device) - cell_x[..., None, None]
    dy = torch.arange(feat_h, dtype=pixels.dtype, device=pixels.device)[:, None] - cell_y[..., None, None]
    window = (dx.abs() <= radius) & (dy.abs() <= radius) & visible[..., None, None]
    gaussians = torch.exp(-(dx ** 2 + dy ** 2) / (2 * sigma ** 2))
    gaussians = torch.where(window, gaussians, torch.zeros_like(gaussians))  # invisible boxes may have NaN radii
    num_views = pixels.size(0)
    index = labels.long()[None, :, None].expand(num_views, -1, feat_h * feat_w)
    heatmap = gaussians.new_zeros(num_views, num_classes, feat_h * feat_w)
    heatmap = heatmap.scatter_reduce(1, index, gaussians.flatten(2), reduce='amax')
    return heatmap.unflatten(2, (feat_h, feat_w))


def object_depth_targets(boxes: Tensor, depth: Tensor, valid: Tensor, feat_hw: Tuple[int, int],
                         pad_hw: Tuple[float, float]) -> Tuple[Tensor, Tensor]:
    """Per feature cell, the depth of the nearest object whose 2D box contains the cell's centre.

    Args:
        boxes (Tensor): ``[N, n, 4]`` 2D boxes ``(x1, y1, x2, y2)`` (:func:`project_box_extents`).
        depth (Tensor): ``[N, n]`` the objects' depths in metres.
        valid (Tensor): ``[N, n]`` bool: which objects count.
        feat_hw (tuple[int, int]): feature map size ``(h, w)``.
        pad_hw (tuple[float, float]): padded image size ``(pad_h, pad_w)``.

    Returns:
        tuple[Tensor, Tensor]:
            - ``target`` ``[N, h, w]``: depth in metres (0 where not covered).
            - ``covered`` ``[N, h, w]`` bool: cells inside some valid box.
    """
    num_views, num_boxes = depth.shape
    if num_boxes == 0:
        target = depth.new_zeros(num_views, *feat_hw)
        return target, target.bool()
    centres = feature_cell_centres(feat_hw, pad_hw, depth.device)
    u, v = centres[..., 0], centres[..., 1]
    corner = boxes[..., None, None, :]
    inside = (u >= corner[..., 0]) & (u < corner[..., 2]) & (v >= corner[..., 1]) & (v < corner[..., 3])
    inside = inside & valid[..., None, None]
    nearest = torch.where(inside, depth[..., None, None], torch.full_like(inside, float('inf'), dtype=depth.dtype))
    nearest = nearest.amin(dim=1)
    covered = inside.any(dim=1)
    return torch.where(covered, nearest, torch.zeros_like(nearest)), covered
