"""Pure camera-geometry helpers shared by the dataset and the multi-view pipelines.

Conventions (those of mmdet3d / CMT):

* ``lidar2cam`` ``[4, 4]`` maps homogeneous LiDAR points to the camera frame
  (x right, y down, z forward); ``cam_intrinsic`` is the ``[4, 4]`` padded
  intrinsic matrix; ``lidar2img = cam_intrinsic @ lidar2cam``. A LiDAR point
  ``p`` projects to the pixel ``(u, v) = (q_0 / q_2, q_1 / q_2)`` with
  ``q = lidar2img @ [p, 1]``; it is in front of the camera when ``q_2 > 0``.
* Pixel coordinates are continuous with the centre of pixel ``(row i, col j)``
  at ``(u, v) = (j, i)`` (OpenCV's ``warpAffine`` convention).
* A 3D augmentation that moves LiDAR points by ``p' = A p`` (``A`` ``[4, 4]``)
  keeps every projection valid when ``lidar2img' = lidar2img @ A^-1`` (same
  for ``lidar2cam``); an image augmentation that moves pixels by
  ``x' = M x`` (``M`` ``[3, 3]`` affine) needs
  ``lidar2img' = M_4 @ lidar2img`` with ``M_4`` = :func:`lift_image_affine`.
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np

# Keys of the per-view 4x4 matrices that map LiDAR coordinates somewhere.
LIDAR_MATRIX_KEYS = ('lidar2img', 'lidar2cam')


def lidar2cam_from_sensor2lidar(sensor2lidar_rotation: np.ndarray, sensor2lidar_translation: np.ndarray) -> np.ndarray:
    """``[4, 4]`` LiDAR-to-camera transform from the info's camera-to-LiDAR rotation ``[3, 3]`` and translation ``[3]``.

    With ``p_lidar = R p_cam + t``: ``p_cam = R^-1 (p_lidar - t)``.
    """
    rotation = np.asarray(sensor2lidar_rotation, dtype=np.float64)
    translation = np.asarray(sensor2lidar_translation, dtype=np.float64).reshape(3)
    if rotation.shape != (3, 3):
        raise ValueError(f'sensor2lidar_rotation must be 3x3, got shape {rotation.shape}')
    inverse = np.linalg.inv(rotation)
    lidar2cam = np.eye(4)
    lidar2cam[:3, :3] = inverse
    lidar2cam[:3, 3] = -inverse @ translation
    return lidar2cam


def pad_intrinsic(intrinsic: np.ndarray) -> np.ndarray:
    """Embed a ``[3, 3]`` (or ``[3, 4]``/``[4, 4]``) camera intrinsic into a ``[4, 4]`` matrix."""
    intrinsic = np.asarray(intrinsic, dtype=np.float64)
    if intrinsic.ndim != 2 or intrinsic.shape[0] < 3 or intrinsic.shape[0] > 4 or intrinsic.shape[1] > 4:
        raise ValueError(f'camera intrinsic must be 3x3, 3x4 or 4x4, got shape {intrinsic.shape}')
    padded = np.eye(4)
    padded[:intrinsic.shape[0], :intrinsic.shape[1]] = intrinsic
    return padded


def project_points(points: np.ndarray, lidar2img: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Project LiDAR points ``[N, 3]`` with ``lidar2img`` ``[4, 4]``.

    Returns:
        tuple: pixel coordinates ``[N, 2]`` ``(u, v)`` and depths ``[N]``
        (``<= 0`` means behind the camera; the pixel is then meaningless).
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    homogeneous = np.concatenate([points, np.ones((len(points), 1))], axis=1)
    projected = homogeneous @ np.asarray(lidar2img, dtype=np.float64).T
    depth = projected[:, 2]
    safe = np.where(np.abs(depth) < 1e-9, 1e-9, depth)
    return projected[:, :2] / safe[:, None], depth


def box_image_rects(corners: np.ndarray, lidar2img: np.ndarray, image_hw: Tuple[int, int],
                    min_size: int = 2) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pixel rectangles covered by the projections of 3D boxes in one camera.

    Args:
        corners: ``[M, 8, 3]`` box corners in the LiDAR frame.
        lidar2img: ``[4, 4]`` projection of the camera.
        image_hw: image ``(height, width)``.
        min_size: rectangles narrower or lower than this many pixels (after
            clipping to the image) count as not visible.

    Returns:
        tuple: ``rects [M, 4]`` int64 ``(x1, y1, x2, y2)`` clipped to the image
        with exclusive ends (``img[y1:y2, x1:x2]`` is the covered region),
        ``depth [M]`` the mean corner depth, and ``visible [M]`` bool: every
        corner in front of the camera and the clipped rectangle at least
        ``min_size`` pixels wide and high.
    """
    corners = np.asarray(corners, dtype=np.float64).reshape(-1, 8, 3)
    num_boxes = corners.shape[0]
    height, width = image_hw
    pixels, depth = project_points(corners.reshape(-1, 3), lidar2img)
    pixels = pixels.reshape(num_boxes, 8, 2)
    depth = depth.reshape(num_boxes, 8)
    in_front = (depth > 0).all(axis=1)
    # Pixel j covers u in [j - 0.5, j + 0.5): round the extremes to pixel indices.
    lower = np.floor(pixels.min(axis=1) + 0.5)
    upper = np.floor(pixels.max(axis=1) + 0.5) + 1
    limits = np.array([width, height], dtype=np.float64)
    lower = np.clip(np.nan_to_num(lower), 0, limits)
    upper = np.clip(np.nan_to_num(upper), 0, limits)
    rects = np.concatenate([lower, upper], axis=1).astype(np.int64)
    visible = in_front & ((rects[:, 2:] - rects[:, :2]) >= min_size).all(axis=1)
    return rects, depth.mean(axis=1), visible


def image_affine(scale_xy: Tuple[float, float], crop_xy: Tuple[float, float], flip: bool, rotate_deg: float,
                 out_size_wh: Tuple[int, int]) -> np.ndarray:
    """``[3, 3]`` pixel affine of resize -> crop -> horizontal flip -> rotation (about the output centre).

    Args:
        scale_xy: resize factors along u and v.
        crop_xy: top-left corner ``(u0, v0)`` of the crop in the resized image
            (may be negative: the output is then padded).
        flip: mirror the cropped image horizontally.
        rotate_deg: counter-clockwise rotation (as seen on screen) in degrees.
        out_size_wh: output image ``(width, height)``.
    """
    width, height = out_size_wh
    matrix = np.diag([scale_xy[0], scale_xy[1], 1.0])
    matrix[:2, 2] = -np.asarray(crop_xy, dtype=np.float64)
    if flip:
        matrix = np.array([[-1.0, 0.0, width - 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]) @ matrix
    if rotate_deg:
        angle = np.deg2rad(rotate_deg)
        cos, sin = np.cos(angle), np.sin(angle)
        center = np.array([(width - 1) / 2.0, (height - 1) / 2.0])
        rotation = np.eye(3)
        rotation[:2, :2] = [[cos, sin], [-sin, cos]]
        rotation[:2, 2] = center - rotation[:2, :2] @ center
        matrix = rotation @ matrix
    return matrix


def lift_image_affine(affine: np.ndarray) -> np.ndarray:
    """``[4, 4]`` matrix ``M_4`` with ``M_4 @ lidar2img`` the projection after the pixel affine ``[3, 3]``."""
    lifted = np.eye(4)
    lifted[:2, :3] = affine[:2, :3]
    return lifted


def update_lidar_matrices(results: Dict, point_transform: np.ndarray) -> None:
    """After LiDAR-frame data moved by ``p' = point_transform @ p``, update every per-view LiDAR matrix in place.

    Each list under :data:`LIDAR_MATRIX_KEYS` present in ``results`` gets its
    elements replaced (the list objects are kept, so aliases stay in sync).
    """
    inverse = np.linalg.inv(np.asarray(point_transform, dtype=np.float64))
    for key in LIDAR_MATRIX_KEYS:
        matrices: List[np.ndarray] = results.get(key)
        if matrices is None:
            continue
        for view, matrix in enumerate(matrices):
            matrices[view] = np.asarray(matrix, dtype=np.float64) @ inverse


def compose_lidar2img(cam_intrinsics: Sequence[np.ndarray], lidar2cams: Sequence[np.ndarray]) -> List[np.ndarray]:
    """``lidar2img`` per view: ``cam_intrinsic[v] @ lidar2cam[v]``."""
    if len(cam_intrinsics) != len(lidar2cams):
        raise ValueError(f'{len(cam_intrinsics)} intrinsics for {len(lidar2cams)} extrinsics')
    return [np.asarray(k, dtype=np.float64) @ np.asarray(e, dtype=np.float64)
            for k, e in zip(cam_intrinsics, lidar2cams)]
