"""Box encoding used by CMT's regression branch and its Hungarian matching.

CMT regresses boxes in a 10-dim *normalized* code. The order of the code is the
one of upstream CMT / PETR (checkpoints were trained with it)::

    index  0   1   2      3      4   5      6         7         8   9
    code   cx  cy  log w  log l  cz  log h  sin(yaw)  cos(yaw)  vx  vy

``w, l, h`` are the three box sizes in the order of mmdet3d's LiDAR boxes
(``x_size, y_size, z_size``), ``(cx, cy, cz)`` the gravity centre in metres
(not rescaled by the point-cloud range). The velocity columns are optional: a
7-dim box encodes to 8 columns.

Sizes must be positive: ``log`` of a non-positive size is ``-inf``/``nan``.
Callers that can meet degenerate ground truth filter the rows with
``torch.isfinite(code).all(-1)`` (as CMT's losses do). :func:`heading_axis`
maps the ``(sin, cos)`` columns to the box axis (a heading and its reverse alike).
"""
from typing import Optional, Sequence

import torch

_BOX_DIMS = (7, 9)
_CODE_DIMS = (8, 10)


def normalize_bbox(bboxes: torch.Tensor, pc_range: Optional[Sequence[float]] = None) -> torch.Tensor:
    """Encode boxes into CMT's regression code.

    Args:
        bboxes (Tensor): ``[..., 7]`` ``(x, y, z, w, l, h, yaw)`` or ``[..., 9]``
            with ``(vx, vy)`` appended; ``(x, y, z)`` the gravity centre.
        pc_range (Sequence[float], optional): accepted so that call sites of
            upstream CMT (which pass it) keep working; CMT's code does not
            rescale centres, so the value does not change the result.

    Returns:
        Tensor: ``[..., 8]`` or ``[..., 10]`` code, see the module docstring.
    """
    if bboxes.size(-1) not in _BOX_DIMS:
        raise ValueError(f'normalize_bbox expects boxes with 7 or 9 values in the last dim, got shape '
                         f'{tuple(bboxes.shape)}')
    center_xy = bboxes[..., 0:2]
    center_z = bboxes[..., 2:3]
    log_wl = bboxes[..., 3:5].log()
    log_h = bboxes[..., 5:6].log()
    yaw = bboxes[..., 6:7]
    parts = [center_xy, log_wl, center_z, log_h, yaw.sin(), yaw.cos()]
    if bboxes.size(-1) == 9:
        parts.append(bboxes[..., 7:9])
    return torch.cat(parts, dim=-1)


def denormalize_bbox(normalized_bboxes: torch.Tensor, pc_range: Optional[Sequence[float]] = None) -> torch.Tensor:
    """Decode CMT's regression code back to boxes; the inverse of :func:`normalize_bbox`.

    Args:
        normalized_bboxes (Tensor): ``[..., 8]`` or ``[..., 10]`` code.
        pc_range (Sequence[float], optional): accepted for call compatibility
            with upstream CMT; does not change the result.

    Returns:
        Tensor: ``[..., 7]`` ``(x, y, z, w, l, h, yaw)`` or ``[..., 9]`` with
        ``(vx, vy)``; ``yaw = atan2(sin, cos)`` in ``(-pi, pi]``.
    """
    if normalized_bboxes.size(-1) not in _CODE_DIMS:
        raise ValueError(f'denormalize_bbox expects a code with 8 or 10 values in the last dim, got shape '
                         f'{tuple(normalized_bboxes.shape)}')
    center_xy = normalized_bboxes[..., 0:2]
    size_wl = normalized_bboxes[..., 2:4].exp()
    center_z = normalized_bboxes[..., 4:5]
    size_h = normalized_bboxes[..., 5:6].exp()
    yaw = torch.atan2(normalized_bboxes[..., 6:7], normalized_bboxes[..., 7:8])
    parts = [center_xy, center_z, size_wl, size_h, yaw]
    if normalized_bboxes.size(-1) == 10:
        parts.append(normalized_bboxes[..., 8:10])
    return torch.cat(parts, dim=-1)


#: softens :func:`heading_axis` of predictions near ``(0, 0)``, where the axis is undefined
AXIS_EPS = 0.01


def heading_axis(sin_cos: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """``[n, 2]`` ``(sin 2a, cos 2a)`` of the angle ``a`` of ``[n, 2]`` ``(sin, cos)`` values (not necessarily unit).

    The box's axis: equal for a heading and its reverse. CMT's L1 on ``(sin, cos)`` cannot reward the axis on its
    own: while front and back are undecided, the best ``(sin, cos)`` for a heading ``a`` or ``a + pi`` is any point
    between the two, whatever ``a`` is, so a model learns the axis only together with the front. ``eps`` is added
    to ``sin^2 + cos^2`` (predictions start near 0).
    """
    sin, cos = sin_cos.unbind(-1)
    norm = sin * sin + cos * cos + eps
    return torch.stack((2 * sin * cos, cos * cos - sin * sin), dim=-1) / norm[..., None]
