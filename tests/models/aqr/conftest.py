"""Tiny camera rigs with hand-checkable projections for the AQR tests.

Every camera has focal length ``F`` and principal point ``(CX, CY)`` on a
``IMG_H x IMG_W`` input image. The front camera looks along +x with
``u = CX - F * y / x``, ``v = CY - F * z / x`` (depth ``x``); the back camera
looks along -x with ``u = CX + F * y / (-x)`` ... written out below.
"""
import numpy as np
import pytest

F, CX, CY = 8.0, 24.0, 16.0
IMG_H, IMG_W = 32, 48
PC_RANGE = [-10.0, -10.0, -5.0, 10.0, 10.0, 3.0]


def front_camera():
    """lidar2img of a camera looking along +x: (u*d, v*d, d) = (CX*x - F*y, CY*x - F*z, x)."""
    return np.array([[CX, -F, 0, 0], [CY, 0, -F, 0], [1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float64)


def back_camera():
    """lidar2img of a camera looking along -x: (u*d, v*d, d) = (-CX*x + F*y, -CY*x - F*z, -x)."""
    return np.array([[-CX, F, 0, 0], [-CY, 0, -F, 0], [-1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float64)


def make_meta(cameras, img_shape=(IMG_H, IMG_W, 3), pad_shape=None):
    """One sample's img_meta with per-view shape lists, as the multi-view pipeline writes them."""
    pad_shape = pad_shape or img_shape
    return dict(lidar2img=list(cameras), img_shape=[img_shape] * len(cameras),
                pad_shape=[pad_shape] * len(cameras))


def normalise(points):
    """Metric LiDAR points [..., 3] -> normalised to [0, 1] in PC_RANGE."""
    lo, hi = np.array(PC_RANGE[:3]), np.array(PC_RANGE[3:])
    return (np.asarray(points, dtype=np.float64) - lo) / (hi - lo)


@pytest.fixture
def rig():
    """Helpers for building metas and points (see the module docstring)."""
    return dict(front=front_camera, back=back_camera, meta=make_meta, normalise=normalise, pc_range=PC_RANGE)
