"""Query projection: normalised 3D reference points -> BEV cell and camera feature cell.

Pure functions (no parameters, no gradients) so the geometry can be tested by hand.

Conventions (upstream CMT's ``CmtHead.coords_bev``, whose BEV position embedding for the flattened token
``i = row * W_bev + col`` is built from ``((col + 0.5) / W_bev, (row + 0.5) / H_bev)``):

* reference points are normalised to ``[0, 1]`` inside ``pc_range = [x_min, y_min, z_min, x_max, y_max, z_max]``;
  normalised ``x`` -> BEV column, normalised ``y`` -> BEV row;
* BEV tokens are the feature map ``[bs, C, H_bev, W_bev]`` flattened row-major, index ``row * W_bev + col``;
* camera tokens are ``[bs * N, C, H_img, W_img]`` flattened as ``(view, h, w)`` row-major; a camera cell is
  ``(view, h, w)``.

Camera projection uses ``img_meta['lidar2img']`` (N 4x4 matrices mapping homogeneous LiDAR points to
``(u * d, v * d, d, 1)`` in the *input image* after the pipeline's resize/crop). A point is visible in a view
when its depth is positive and ``0 <= u < img_w``, ``0 <= v < img_h`` with ``img_shape`` the un-padded input
image size. The camera position embedding (:func:`~..utils.positional_encoding.image_frustum_points`, like
upstream's ``_rv_pe``) passes the ray of feature cell ``(i, j)`` through pixel ``(j * stride_w, i * stride_h)``
with ``stride = pad_shape / feature shape``, so the cell whose ray is nearest the projected pixel is
``(floor(v / stride_h + 1/2), floor(u / stride_w + 1/2))`` (halves round up), clamped to the feature map.
The first such view (lowest index) is chosen. Queries visible in no view get ``visible = False`` and the camera
cell ``(-1, -1, -1)``; they are never mapped to a real cell.
"""
from typing import Dict, Sequence, Tuple

import torch
from torch import Tensor

from ...attention.bias.window_cells import clamp_to_grid
from ...utils.host_data import device_constant
from ..utils.camera_geometry import CameraGeometry
from ..utils.positional_encoding import denormalize_points

#: Camera cell given to queries that are visible in no view.
INVISIBLE_CELL = -1


def _check_pc_range(pc_range: Sequence[float]) -> None:
    values = [float(v) for v in pc_range]
    if len(values) != 6:
        raise ValueError(f'pc_range must have 6 values [x_min, y_min, z_min, x_max, y_max, z_max], got {values}')
    if not all(high > low for low, high in zip(values[:3], values[3:])):
        raise ValueError(f'pc_range must have max > min on every axis, got {values}')


def bev_cells(reference_points: Tensor, bev_shape: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
    """BEV cell of every query.

    Args:
        reference_points (Tensor): ``[bs, Q, 3]`` (or ``[bs, Q, 2]``) normalised
            points; ``x`` (index 0) -> column, ``y`` (index 1) -> row.
        bev_shape (tuple[int, int]): ``(H_bev, W_bev)``.

    Returns:
        tuple[Tensor, Tensor]:
            * ``pts_bev`` ``[bs, Q, 2]`` long, ``(row, col)`` = ``(y, x)``;
            * ``pts_idx`` ``[bs, Q]`` long, ``row * W_bev + col``.
    """
    height, width = (int(s) for s in bev_shape)
    if height <= 0 or width <= 0:
        raise ValueError(f'bev_shape must be positive, got {tuple(bev_shape)}')
    if reference_points.dim() != 3 or reference_points.shape[-1] not in (2, 3):
        raise ValueError(f'reference_points must be [bs, Q, 2|3], got shape {tuple(reference_points.shape)}')
    pts = reference_points.detach().float().clamp(0.0, 1.0)
    device = pts.device
    col_row = clamp_to_grid((pts[..., :2] * device_constant([width, height], device, torch.float32)).floor().long(),
                            (width, height))
    return col_row.flip(-1), (col_row * device_constant([1, width], device, torch.long)).sum(-1)


def camera_cells(points: Tensor,
                 lidar2img: Tensor,
                 img_hw: Tensor,
                 pad_hw: Tensor,
                 feat_hw: Tuple[int, int],
                 min_depth: float = 1e-5) -> Tuple[Tensor, Tensor]:
    """Camera feature cell of every query: the first view that sees it.

    Args:
        points (Tensor): ``[bs, Q, 3]`` metric LiDAR coordinates.
        lidar2img (Tensor): ``[bs, N, 4, 4]``.
        img_hw (Tensor): ``[bs, N, 2]`` un-padded input image (height, width);
            a point must fall inside it to be visible.
        pad_hw (Tensor): ``[bs, N, 2]`` padded input image (height, width); the
            feature stride is ``pad_hw / feat_hw``.
        feat_hw (tuple[int, int]): camera feature map ``(H_img, W_img)``.
        min_depth (float): a point is in front of the camera when its depth
            exceeds this.

    Returns:
        tuple[Tensor, Tensor]:
            * ``pts_pers_idx`` ``[bs, Q, 3]`` long ``(view, h, w)``;
              ``(-1, -1, -1)`` for invisible queries;
            * ``visible`` ``[bs, Q]`` bool.
    """
    bs, num_query = points.shape[:2]
    if lidar2img.dim() != 4 or lidar2img.shape[0] != bs or lidar2img.shape[2:] != (4, 4):
        raise ValueError(f'lidar2img must be [bs={bs}, N, 4, 4], got {tuple(lidar2img.shape)}')
    num_views = lidar2img.shape[1]
    if num_views == 0:
        raise ValueError('lidar2img has no camera views')
    feat_h, feat_w = (int(s) for s in feat_hw)
    if feat_h <= 0 or feat_w <= 0:
        raise ValueError(f'camera feature shape must be positive, got {tuple(feat_hw)}')
    pts = points.detach().float()
    homo = torch.cat([pts, pts.new_ones(bs, num_query, 1)], dim=-1)
    cam = torch.einsum('bvij,bqj->bvqi', lidar2img.float(), homo)  # [bs, N, Q, 4]
    depth = cam[..., 2]
    in_front = depth > min_depth
    # (v, u) pixel of every (view, query): the axis order of img_hw, pad_hw and the feature cells (h, w)
    pixel = cam[..., :2].flip(-1) / torch.where(in_front, depth, 1.0)[..., None]
    seen = in_front & ((pixel >= 0) & (pixel < img_hw[:, :, None])).all(-1)  # [bs, N, Q]
    visible = seen.any(dim=1)
    view = seen.to(torch.uint8).argmax(dim=1)  # first view that sees the point
    pixel = pixel.gather(1, view[:, None, :, None].expand(-1, -1, -1, 2)).squeeze(1)  # [bs, Q, 2]
    pad_sel = pad_hw.gather(1, view[..., None].expand(-1, -1, 2))  # [bs, Q, 2]
    # nearest ray: cell j's ray passes through pixel j * stride
    feat = device_constant([feat_h, feat_w], points.device, torch.float32)
    cells = clamp_to_grid((pixel * feat / pad_sel + 0.5).floor().long(), (feat_h, feat_w))
    pers = torch.where(visible[..., None], torch.cat([view[..., None], cells], dim=-1), INVISIBLE_CELL)
    return pers, visible


def project_to_camera_cells(reference_points: Tensor,
                            pc_range: Sequence[float],
                            camera_shape: Tuple[int, int, int],
                            geometry: CameraGeometry) -> Tuple[Tensor, Tensor]:
    """Project every query's reference point to its camera feature cell (:func:`camera_cells`).

    Args:
        reference_points (Tensor): ``[bs, Q, 3]`` normalised to ``[0, 1]`` in
            ``pc_range`` (values outside are clamped).
        pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.
        camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)`` of the camera
            memory; N must equal the geometry's.
        geometry (CameraGeometry): the batch's ``lidar2img`` and per-view image and padded sizes.

    Returns:
        tuple[Tensor, Tensor]: ``pts_pers_idx`` ``[bs, Q, 3]`` long
        ``(view, h, w)`` (``-1`` if invisible) and ``visible`` ``[bs, Q]`` bool.
    """
    if reference_points.dim() != 3 or reference_points.shape[-1] != 3:
        raise ValueError(f'reference_points must be [bs, Q, 3], got shape {tuple(reference_points.shape)}')
    bs = reference_points.shape[0]
    if geometry.batch_size != bs:
        raise ValueError(f'got the img_metas of {geometry.batch_size} samples for a batch of {bs} reference point sets')
    num_views, feat_h, feat_w = (int(s) for s in camera_shape)
    _check_pc_range(pc_range)
    if geometry.num_views != num_views:
        raise ValueError(f'camera memory has {num_views} views but img_metas lidar2img has {geometry.num_views}')
    # reference points outside [0, 1] are clamped, as upstream CMT clamps them with inverse_sigmoid
    points = denormalize_points(reference_points.detach().float().clamp(0.0, 1.0), pc_range)
    return camera_cells(points, geometry.lidar2img, geometry.view_img_hw, geometry.view_pad_hw, (feat_h, feat_w))


def project_reference_points(reference_points: Tensor,
                             pc_range: Sequence[float],
                             bev_shape: Tuple[int, int],
                             camera_shape: Tuple[int, int, int],
                             geometry: CameraGeometry) -> Dict[str, Tensor]:
    """Project every query's reference point to its BEV cell and camera cell.

    Args:
        reference_points (Tensor): ``[bs, Q, 3]`` normalised to ``[0, 1]`` in
            ``pc_range`` (any Q: 900 matching queries, plus DN queries if given).
        pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.
        bev_shape (tuple[int, int]): ``(H_bev, W_bev)`` of the BEV memory.
        camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)`` of the camera
            memory; N must equal the geometry's.
        geometry (CameraGeometry): the batch's ``lidar2img`` and per-view image and padded sizes.

    Returns:
        dict[str, Tensor]: ``projection_info``:
            * ``pts_bev`` ``[bs, Q, 2]`` long ``(y, x)`` BEV cell;
            * ``pts_idx`` ``[bs, Q]`` long flattened BEV index;
            * ``pts_pers_idx`` ``[bs, Q, 3]`` long ``(view, h, w)``, ``-1`` if invisible;
            * ``visible`` ``[bs, Q]`` bool.
    """
    pts_pers_idx, visible = project_to_camera_cells(reference_points, pc_range, camera_shape, geometry)
    pts_bev, pts_idx = bev_cells(reference_points, bev_shape)
    return dict(pts_bev=pts_bev, pts_idx=pts_idx, pts_pers_idx=pts_pers_idx, visible=visible)
