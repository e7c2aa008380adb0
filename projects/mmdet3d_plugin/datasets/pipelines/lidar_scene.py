"""Rigid, scale and mirror transforms of a whole LiDAR-frame scene inside a pipeline ``results`` dict.

Each function moves, in place and consistently,

* ``results['points']`` (an mmdet3d ``BasePoints``) when present,
* every box structure named in ``results['bbox3d_fields']`` (centres,
  sizes, yaw and velocity, through mmdet3d's box API),
* every per-view LiDAR matrix (``lidar2img``, ``lidar2cam``), so that a
  point that moved by ``p' = A p`` still projects onto the same pixel
  (``lidar2img' = lidar2img @ A^-1``, see ``camera_geometry``),

and returns the ``[4, 4]`` matrix ``A`` it applied. Points, boxes (mmdet3d
reads the yaw change from the matrix) and the matrices are rotated with one
and the same matrix, so their senses cannot disagree.
"""
from typing import Dict, Sequence

import numpy as np

from ..camera_geometry import update_lidar_matrices

FLIP_DIRECTIONS = ('horizontal', 'vertical')


def _box_fields(results: Dict) -> list:
    return [results[key] for key in results.get('bbox3d_fields', [])]


def rotation_z_transposed(angle: float) -> np.ndarray:
    """``[3, 3]`` float32 ``R^T`` of the rotation by ``angle`` radians about +z, for row-vector points ``p @ R^T``.

    The matrix of mmdet3d's ``rotation_3d_in_axis(..., axis=2,
    return_mat=True)``, built here because that function's ``array_converter``
    decorator leaves a reference cycle behind on every call.
    """
    cos, sin = np.cos(angle), np.sin(angle)
    return np.array([[cos, sin, 0.0], [-sin, cos, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)


def rotate_scene(results: Dict, angle: float) -> np.ndarray:
    """Rotate the scene about the LiDAR z axis by ``angle`` radians (mmdet3d's sense: boxes' yaw += angle).

    Sets ``results['pcd_rotation']`` (the ``[3, 3]`` matrix ``R^T`` that
    row-vector points are multiplied with, as mmdet3d does) and
    ``results['pcd_rotation_angle']``.
    """
    rot_mat_t = rotation_z_transposed(angle)
    if 'points' in results:
        results['points'].rotate(rot_mat_t)
    for boxes in _box_fields(results):
        boxes.rotate(rot_mat_t)
    results['pcd_rotation'] = rot_mat_t
    results['pcd_rotation_angle'] = float(angle)
    transform = np.eye(4)
    transform[:3, :3] = rot_mat_t.T
    update_lidar_matrices(results, transform)
    return transform


def scale_scene(results: Dict, factor: float) -> np.ndarray:
    """Scale the scene about the LiDAR origin by ``factor``; sets ``results['pcd_scale_factor']``."""
    if factor <= 0:
        raise ValueError(f'scale factor must be positive, got {factor}')
    if 'points' in results:
        results['points'].scale(factor)
    for boxes in _box_fields(results):
        boxes.scale(factor)
    results['pcd_scale_factor'] = float(factor)
    transform = np.diag([factor, factor, factor, 1.0])
    update_lidar_matrices(results, transform)
    return transform


def translate_scene(results: Dict, offset: Sequence[float]) -> np.ndarray:
    """Translate the scene by ``offset`` ``[3]`` metres; sets ``results['pcd_trans']``."""
    offset = np.asarray(offset, dtype=np.float64).reshape(3)
    if 'points' in results:
        results['points'].translate(offset)
    for boxes in _box_fields(results):
        boxes.translate(offset)
    results['pcd_trans'] = offset
    transform = np.eye(4)
    transform[:3, 3] = offset
    update_lidar_matrices(results, transform)
    return transform


def flip_scene(results: Dict, direction: str) -> np.ndarray:
    """Mirror the scene in bird's-eye view: ``'horizontal'`` negates y, ``'vertical'`` negates x (mmdet3d names)."""
    if direction not in FLIP_DIRECTIONS:
        raise ValueError(f'flip direction must be one of {FLIP_DIRECTIONS}, got {direction!r}')
    if 'points' in results:
        results['points'].flip(direction)
    for boxes in _box_fields(results):
        boxes.flip(direction)
    axis = 1 if direction == 'horizontal' else 0
    transform = np.eye(4)
    transform[axis, axis] = -1.0
    update_lidar_matrices(results, transform)
    return transform


def random_bev_flips(results: Dict, horizontal_ratio: float, vertical_ratio: float) -> None:
    """Mirror y with probability ``horizontal_ratio``, then x with probability ``vertical_ratio``.

    Flags already in ``results`` (``pcd_horizontal_flip`` /
    ``pcd_vertical_flip``, e.g. from ``MultiScaleFlipAug3D``) are used instead
    of random draws; the drawn flags are stored there, and ``'HF'`` / ``'VF'``
    are appended to ``transformation_3d_flow`` for the mirrors applied.
    """
    flow = results.setdefault('transformation_3d_flow', [])
    for key, direction, ratio, name in (('pcd_horizontal_flip', 'horizontal', horizontal_ratio, 'HF'),
                                        ('pcd_vertical_flip', 'vertical', vertical_ratio, 'VF')):
        if key not in results:
            results[key] = bool(np.random.rand() < ratio)
        if results[key]:
            flip_scene(results, direction)
            flow.append(name)
