"""Points in the frame of LiDAR boxes: how far along, across and above each box's bottom centre they lie."""
import torch
from torch import Tensor


def box_frame_offsets(points: Tensor, boxes: Tensor) -> Tensor:
    """``[P, n, 3]`` offsets of ``[P, >=3]`` points from ``[n, >=7]`` boxes, in each box's frame.

    Args:
        points (Tensor): ``[P, >=3]`` (``x, y, z`` first; with 2 columns, ``z`` is taken as 0).
        boxes (Tensor): ``[n, >=7]`` mmdet3d LiDAR boxes ``(x, y, z_bottom, x_size, y_size, z_size, yaw)``,
            yaw counter-clockwise from ``+x``, ``x_size`` along the heading.

    Returns:
        Tensor: ``[P, n, 3]`` ``(along, across, up)``: along the heading, to its left, above the bottom; a point
        is inside a box when ``|along| <= x_size / 2``, ``|across| <= y_size / 2`` and ``0 <= up <= z_size``.
    """
    xyz = points[:, :3].to(boxes.dtype)
    if xyz.shape[1] == 2:
        xyz = torch.cat([xyz, xyz.new_zeros(len(xyz), 1)], dim=1)
    offset = xyz[:, None, :] - boxes[None, :, :3]
    cos, sin = torch.cos(boxes[:, 6]), torch.sin(boxes[:, 6])
    along = offset[..., 0] * cos + offset[..., 1] * sin
    across = -offset[..., 0] * sin + offset[..., 1] * cos
    return torch.stack([along, across, offset[..., 2]], dim=-1)
