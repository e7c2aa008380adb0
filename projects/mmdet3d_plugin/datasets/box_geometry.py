"""Pure numpy geometry of LiDAR boxes used by the GT-database tools and the object-sampling pipeline.

Boxes follow mmdet3d's ``LiDARInstance3DBoxes.tensor`` layout: ``[M, >=7]``
rows ``(x, y, z, dx, dy, dz, yaw, ...)`` with ``(x, y, z)`` the centre of the
*bottom* face, ``dx`` the size along the box's heading, ``dy`` across it,
``dz`` the height and ``yaw`` the heading about +z, counter-clockwise from
the LiDAR x axis. Extra columns (velocity) are ignored.
"""
import numpy as np

#: ``[8, 3]`` corner offsets from the bottom centre in units of ``(dx, dy, dz)``, in the box frame, in the order of
#: mmdet3d's ``LiDARInstance3DBoxes.corners``
_CORNER_OFFSETS = np.array([[-0.5, -0.5, 0.0], [-0.5, -0.5, 1.0], [-0.5, 0.5, 1.0], [-0.5, 0.5, 0.0],
                            [0.5, -0.5, 0.0], [0.5, -0.5, 1.0], [0.5, 0.5, 1.0], [0.5, 0.5, 0.0]])


def _check_boxes(boxes: np.ndarray, name: str) -> np.ndarray:
    boxes = np.asarray(boxes, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] < 7:
        raise ValueError(f'{name} must be [M, >=7] (x, y, z, dx, dy, dz, yaw, ...), got shape {boxes.shape}')
    return boxes


def points_in_boxes(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Which points lie inside which boxes (faces included).

    Args:
        points: ``[N, >=3]``; the first three columns are x, y, z.
        boxes: ``[M, >=7]`` (see the module docstring).

    Returns:
        np.ndarray: ``[N, M]`` bool.
    """
    points = np.asarray(points, dtype=np.float64)
    boxes = _check_boxes(boxes, 'boxes')
    inside = np.zeros((points.shape[0], boxes.shape[0]), dtype=bool)
    for index, (x, y, z, dx, dy, dz, yaw) in enumerate(boxes[:, :7]):
        # Cheap bounding-circle and height pre-selection, then the exact test in the box frame.
        offset_x, offset_y, offset_z = points[:, 0] - x, points[:, 1] - y, points[:, 2] - z
        near = np.nonzero((offset_x ** 2 + offset_y ** 2 <= (dx ** 2 + dy ** 2) / 4) & (offset_z >= 0)
                          & (offset_z <= dz))[0]
        along = offset_x[near] * np.cos(yaw) + offset_y[near] * np.sin(yaw)
        across = -offset_x[near] * np.sin(yaw) + offset_y[near] * np.cos(yaw)
        inside[near, index] = (np.abs(along) <= dx / 2) & (np.abs(across) <= dy / 2)
    return inside


def box_corners(boxes: np.ndarray) -> np.ndarray:
    """``[M, 8, 3]`` corners of the boxes, in the order of mmdet3d's ``LiDARInstance3DBoxes.corners``.

    mmdet3d's property rotates through its ``array_converter`` decorator,
    whose self-referencing ``recursive_recover`` closure leaves a reference
    cycle behind on every call; this is the same geometry in plain numpy.
    """
    boxes = _check_boxes(boxes, 'boxes')
    local = _CORNER_OFFSETS[None] * boxes[:, None, 3:6]  # [M, 8, 3]
    cos, sin = np.cos(boxes[:, 6])[:, None], np.sin(boxes[:, 6])[:, None]
    x = local[..., 0] * cos - local[..., 1] * sin
    y = local[..., 0] * sin + local[..., 1] * cos
    return np.stack([x, y, local[..., 2]], axis=-1) + boxes[:, None, :3]


def bev_corners(boxes: np.ndarray) -> np.ndarray:
    """``[M, 4, 2]`` bird's-eye-view corners of the boxes, counter-clockwise."""
    boxes = _check_boxes(boxes, 'boxes')
    signs = np.array([[1, 1], [-1, 1], [-1, -1], [1, -1]], dtype=np.float64) / 2
    local = signs[None] * boxes[:, None, 3:5]  # [M, 4, 2]
    cos, sin = np.cos(boxes[:, 6])[:, None], np.sin(boxes[:, 6])[:, None]
    x = local[..., 0] * cos - local[..., 1] * sin + boxes[:, None, 0]
    y = local[..., 0] * sin + local[..., 1] * cos + boxes[:, None, 1]
    return np.stack([x, y], axis=-1)


def bev_overlaps(boxes_a: np.ndarray, boxes_b: np.ndarray) -> np.ndarray:
    """Whether the bird's-eye-view rectangles of two box sets overlap (separating-axis test).

    Rectangles that only touch count as overlapping.

    Args:
        boxes_a: ``[M, >=7]``.
        boxes_b: ``[K, >=7]``.

    Returns:
        np.ndarray: ``[M, K]`` bool.
    """
    corners_a, corners_b = bev_corners(boxes_a), bev_corners(boxes_b)
    yaw_a, yaw_b = _check_boxes(boxes_a, 'boxes_a')[:, 6], _check_boxes(boxes_b, 'boxes_b')[:, 6]
    overlap = np.ones((corners_a.shape[0], corners_b.shape[0]), dtype=bool)
    for yaws, broadcast in ((yaw_a, lambda v: v[:, None]), (yaw_b, lambda v: v[None, :])):
        for angle in (yaws, yaws + np.pi / 2):
            axis = np.stack([np.cos(angle), np.sin(angle)], axis=-1)  # [M or K, 2]
            axis = broadcast(axis)[..., None, :]  # [M, 1, 1, 2] or [1, K, 1, 2]
            proj_a = (corners_a[:, None] * axis).sum(-1)  # [M, K, 4]
            proj_b = (corners_b[None, :] * axis).sum(-1)
            separated = (proj_a.max(-1) < proj_b.min(-1)) | (proj_b.max(-1) < proj_a.min(-1))
            overlap &= ~separated
    return overlap
