"""Rigid transforms between the nuScenes frames (sensor, ego, global), as pure numpy functions.

Rotations are stored as nuScenes does: quaternions ``[w, x, y, z]``; a pose maps points of
its child frame into its parent frame, ``p_parent = R @ p_child + t``.
"""
from typing import Sequence, Tuple

import numpy as np
from pyquaternion import Quaternion


def yaw_to_quaternion(yaw: float) -> list:
    """Quaternion ``[w, x, y, z]`` of a rotation by ``yaw`` radians about +z."""
    return [float(np.cos(yaw / 2.0)), 0.0, 0.0, float(np.sin(yaw / 2.0))]


def matrix_to_quaternion(rotation: np.ndarray) -> list:
    """Quaternion ``[w, x, y, z]`` of a ``[3, 3]`` rotation matrix (w >= 0)."""
    q = Quaternion(matrix=np.asarray(rotation, dtype=np.float64), atol=1e-6)
    elements = q.elements if q.w >= 0 else -q.elements
    return [float(v) for v in elements]


def quaternion_to_matrix(quaternion: Sequence[float]) -> np.ndarray:
    """``[3, 3]`` rotation matrix of a quaternion ``[w, x, y, z]``."""
    return Quaternion(list(quaternion)).rotation_matrix


def pose_matrix(translation: Sequence[float], rotation: Sequence[float]) -> np.ndarray:
    """``[4, 4]`` homogeneous transform of a pose (child → parent)."""
    mat = np.eye(4)
    mat[:3, :3] = quaternion_to_matrix(rotation)
    mat[:3, 3] = np.asarray(translation, dtype=np.float64)
    return mat


def sensor_to_lidar(sensor2ego: Tuple[Sequence[float], Sequence[float]],
                    sensor_ego2global: Tuple[Sequence[float], Sequence[float]],
                    lidar2ego: Tuple[Sequence[float], Sequence[float]],
                    ego2global: Tuple[Sequence[float], Sequence[float]]) -> Tuple[np.ndarray, np.ndarray]:
    """Rotation and translation from a sensor frame (at its own time) to the key-frame LiDAR frame.

    The chain is sensor → ego(t_sensor) → global → ego(t_key) → LiDAR. Each argument is a
    ``(translation [3], rotation [w, x, y, z])`` pose.

    Returns:
        tuple[np.ndarray, np.ndarray]: ``R [3, 3]`` and ``T [3]`` with
        ``p_lidar = R @ p_sensor + T`` (so for row-vector points ``points @ R.T + T``,
        the convention of mmdet3d's ``sensor2lidar_rotation`` / ``sensor2lidar_translation``).
    """
    sensor2global = pose_matrix(*sensor_ego2global) @ pose_matrix(*sensor2ego)
    lidar2global = pose_matrix(*ego2global) @ pose_matrix(*lidar2ego)
    sensor2lidar = np.linalg.inv(lidar2global) @ sensor2global
    return sensor2lidar[:3, :3], sensor2lidar[:3, 3]
