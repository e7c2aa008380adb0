"""Pure geometry of the sensor corruptions (``pipelines/corruption.py``): LiDAR azimuths and beams, sweep frames,
camera directions, rotations and boxes, segments through boxes, in numpy."""
from typing import Dict, Sequence, Tuple

import numpy as np

#: Two sweeps are at least 50 ms apart in nuScenes (20 Hz); lags closer than this belong to the same sweep.
SWEEP_LAG_TOLERANCE_S = 1e-3


def camera_forward_yaw(lidar2cam: np.ndarray) -> float:
    """Yaw (radians, ``atan2(y, x)`` in the LiDAR frame) of a camera's optical axis projected onto the LiDAR x-y plane.

    The optical axis (camera +z) in LiDAR coordinates is the third row of
    the rotation of ``lidar2cam`` ``[4, 4]``.
    """
    axis = np.asarray(lidar2cam, dtype=np.float64)[2, :3]
    if np.hypot(axis[0], axis[1]) < 1e-6:
        raise ValueError(f'the camera looks straight up or down (optical axis {axis.tolist()} in the LiDAR frame): '
                         f'it defines no forward direction')
    return float(np.arctan2(axis[1], axis[0]))


def fov_mask(xy: np.ndarray, forward_yaw: float, fov_deg: float) -> np.ndarray:
    """``[N]`` bool: the points ``xy`` ``[N, 2]`` whose azimuth is within ``fov_deg / 2`` of ``forward_yaw`` (rad)."""
    offset = np.arctan2(xy[:, 1], xy[:, 0]) - forward_yaw
    wrapped = np.remainder(offset + np.pi, 2 * np.pi) - np.pi
    return np.abs(wrapped) <= np.deg2rad(fov_deg) / 2


def beam_indices(xyz: np.ndarray, num_beams: int, elevation_range_deg: Tuple[float, float]) -> np.ndarray:
    """``[N]`` int64 beam of each point ``xyz`` ``[N, 3]`` (sensor frame) of a LiDAR with uniformly spaced beams.

    Beam ``b`` has the elevation ``low + b * (high - low) / (num_beams - 1)``
    (``elevation_range_deg = (low, high)``, beam 0 the lowest); a point
    belongs to the beam of the nearest elevation.
    """
    low, high = elevation_range_deg
    if num_beams < 2 or high <= low:
        raise ValueError(f'a LiDAR needs >= 2 beams and an increasing elevation range, got num_beams={num_beams}, '
                         f'elevation_range_deg={elevation_range_deg}')
    elevation = np.degrees(np.arctan2(xyz[:, 2], np.hypot(xyz[:, 0], xyz[:, 1])))
    beam = np.floor((elevation - low) / ((high - low) / (num_beams - 1)) + 0.5)
    return np.clip(beam, 0, num_beams - 1).astype(np.int64)


def kept_beams(num_beams: int, keep: int) -> np.ndarray:
    """Indices of the ``keep`` beams of a ``keep``-beam sensor with the same vertical field of view.

    Every ``num_beams / keep``-th beam from the lowest, e.g. 8 of 32: ``[0, 4, ..., 28]``.
    """
    if not 1 <= keep <= num_beams:
        raise ValueError(f'cannot keep {keep} of {num_beams} beams')
    return (np.arange(keep) * num_beams) // keep


def points_in_sweep_frames(xyz: np.ndarray, time_lag: np.ndarray, sweeps: Sequence[Dict],
                           timestamp: float) -> np.ndarray:
    """Undo ``LoadPointsFromMultiSweeps``' motion compensation: each point in the LiDAR frame it was measured in.

    Args:
        xyz: ``[N, 3]`` points in the key frame's LiDAR frame.
        time_lag: ``[N]`` key-frame time minus the point's sweep time (s),
            0 for the key frame (the sweep loader's time column).
        sweeps: the sample's sweep infos (``sensor2lidar_rotation [3, 3]``,
            ``sensor2lidar_translation [3]``, ``timestamp`` in microseconds).
        timestamp: the key frame's time (s).

    Returns:
        np.ndarray: ``[N, 3]`` float64.

    Raises:
        ValueError: a point's lag matches no sweep (the time column is not what it should be).
    """
    out = np.asarray(xyz, dtype=np.float64).copy()
    pending = np.abs(time_lag) > SWEEP_LAG_TOLERANCE_S
    for sweep in sweeps:
        lag = timestamp - sweep['timestamp'] / 1e6
        selected = pending & (np.abs(time_lag - lag) <= SWEEP_LAG_TOLERANCE_S)
        rotation = np.asarray(sweep['sensor2lidar_rotation'], dtype=np.float64)
        translation = np.asarray(sweep['sensor2lidar_translation'], dtype=np.float64).reshape(3)
        out[selected] = (out[selected] - translation) @ rotation
        pending &= ~selected
    if pending.any():
        raise ValueError(f'{int(pending.sum())} points have a sweep time lag (e.g. {float(time_lag[pending][0])} s) '
                         f'that matches none of the sample\'s {len(sweeps)} sweeps: is sweep_time_column the time '
                         f'column written by LoadPointsFromMultiSweeps?')
    return out


def axis_angle_rotation(axis: np.ndarray, angle_deg: float) -> np.ndarray:
    """``[3, 3]`` rotation by ``angle_deg`` degrees about the unit vector ``axis`` (Rodrigues' formula)."""
    x, y, z = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    cross = np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])
    angle = np.deg2rad(angle_deg)
    return np.eye(3) + np.sin(angle) * cross + (1 - np.cos(angle)) * cross @ cross


def boxes_at_time_lag(boxes: np.ndarray, time_lag: float) -> np.ndarray:
    """LiDAR boxes ``[M, 9]`` (velocity ``vx, vy`` in m/s in columns 7, 8) where they were ``time_lag`` s earlier.

    Constant velocity: the centres move by ``-time_lag * (vx, vy)``; an
    unknown (NaN) velocity counts as 0.
    """
    moved = np.array(boxes, dtype=np.float64, copy=True)
    moved[:, :2] -= time_lag * np.nan_to_num(moved[:, 7:9])
    return moved


def enlarged_boxes(boxes: np.ndarray, margin: float) -> np.ndarray:
    """LiDAR boxes ``[M, >=7]`` (bottom centre) grown by ``margin`` metres on every side, bottom included."""
    grown = np.array(boxes, dtype=np.float64, copy=True)
    grown[:, 2] -= margin
    grown[:, 3:6] += 2 * margin
    return grown


def segments_through_boxes(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """``[N, M]`` bool: whether the segment from the sensor origin to each point meets each box (faces included).

    A point inside a box counts (its segment ends there); a point in front
    of a box (nearer along its ray than where the ray enters the box) does
    not. The slab test, in each box's frame.

    Args:
        points: ``[N, >=3]`` x, y, z in the LiDAR frame (the sensor at the origin).
        boxes: ``[M, >=7]`` LiDAR boxes (bottom centre, ``dx, dy, dz, yaw``).
    """
    xyz = np.asarray(points, dtype=np.float64)[:, :3]
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, np.shape(boxes)[-1])
    hits = np.zeros((len(xyz), len(boxes)), dtype=bool)
    for index, (x, y, z, dx, dy, dz, yaw) in enumerate(boxes[:, :7]):
        cos, sin = np.cos(yaw), np.sin(yaw)
        to_box = np.array([[cos, sin, 0.0], [-sin, cos, 0.0], [0.0, 0.0, 1.0]])
        origin = to_box @ -np.array([x, y, z])  # [3]
        direction = (xyz - [x, y, z]) @ to_box.T - origin  # [N, 3]
        low, high = np.array([-dx / 2, -dy / 2, 0.0]), np.array([dx / 2, dy / 2, dz])
        with np.errstate(divide='ignore', invalid='ignore'):
            t_low, t_high = (low - origin) / direction, (high - origin) / direction
        parallel = direction == 0  # the segment runs along the slab: all of it or none of it inside
        inside_slab = (origin >= low) & (origin <= high)
        t_enter = np.where(parallel, np.where(inside_slab, -np.inf, np.inf), np.minimum(t_low, t_high)).max(1)
        t_exit = np.where(parallel, np.where(inside_slab, np.inf, -np.inf), np.maximum(t_low, t_high)).min(1)
        hits[:, index] = (t_enter <= t_exit) & (t_exit >= 0) & (t_enter <= 1)
    return hits


def boxes_rotated_about_origin(boxes: np.ndarray, angle: float) -> np.ndarray:
    """LiDAR boxes ``[M, >=7]`` turned by ``angle`` (rad) about the LiDAR z axis: centre, yaw, velocity (cols 7, 8)."""
    turned = np.array(boxes, dtype=np.float64, copy=True)
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    turned[:, :2] = turned[:, :2] @ rotation.T
    turned[:, 6] += angle
    if turned.shape[1] >= 9:
        turned[:, 7:9] = turned[:, 7:9] @ rotation.T
    return turned


def lidar_misalignment(rotation_deg: float, shift_x: float) -> np.ndarray:
    """``[4, 4]`` MultiCorrupt's spatial misalignment of a point cloud: ``p -> Rx Ry Rz p + (shift_x, 0, 0)``.

    ``Rx``, ``Ry``, ``Rz``: rotations by ``-rotation_deg`` about the LiDAR
    x, y and z axes (right-handed), so ``Rz`` acts first.
    """
    transform = np.eye(4)
    for axis in np.eye(3):
        transform[:3, :3] = transform[:3, :3] @ axis_angle_rotation(axis, -rotation_deg)
    transform[0, 3] = shift_x
    return transform


def camera_yaw_rotation(yaw_deg: float) -> np.ndarray:
    """``[3, 3]`` rotation by ``yaw_deg`` about a camera's y axis (down in the image), in the camera frame.

    Applied to ``lidar2cam`` (``R @ lidar2cam``) it moves every projection
    towards +u (right in the image): by ``f tan(yaw)`` at the principal point.
    """
    return axis_angle_rotation(np.array([0.0, 1.0, 0.0]), yaw_deg)


def yaw_token_shift(yaw_deg: float, focal_px: float, stride_px: float) -> float:
    """Camera tokens by which a calibration yawed by ``yaw_deg`` moves a projection, at the least.

    A direction at angle ``a`` from the optical axis (in the x-z plane)
    projects to ``u = f tan(a)``; yawed, to ``f tan(a + yaw)``. The move is
    smallest at ``a = -yaw / 2``: ``2 f tan(yaw / 2)`` pixels (the same at
    every height in the image), i.e. that many ``stride_px``-pixel tokens.

    Args:
        yaw_deg: the rotation about the camera's vertical axis.
        focal_px: the focal length in pixels of the image the model reads (after resizing).
        stride_px: the camera features' stride in pixels of that image.
    """
    return float(2 * focal_px * np.tan(np.deg2rad(abs(yaw_deg)) / 2) / stride_px)
