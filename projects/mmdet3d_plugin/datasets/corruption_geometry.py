"""Pure geometry of the sensor corruptions (``pipelines/corruption.py``): LiDAR azimuths and beams, sweep frames,
camera directions, rotations and boxes, in numpy."""
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
