"""Synthetic cameras: the 6-camera nuScenes rig and a box renderer.

Cameras use the nuScenes camera frame (x right, y down, z forward). Each object is drawn
as its visible box faces, filled with the class colour and shaded per face, far objects
first, over a sky / ground background split at the horizon.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import cv2
import numpy as np

# nuScenes image size; intrinsics below are given for it and scaled to the chosen size.
NUSCENES_IMAGE_SIZE = (1600, 900)


@dataclass(frozen=True)
class CameraMount:
    """Where a camera sits on the ego and how wide it sees (nuScenes-like values).

    Args:
        yaw_deg: viewing direction in the ego frame (0 = forward, +90 = left).
        translation: ``[3]`` position in the ego frame, metres.
        focal_1600: focal length in pixels for a 1600-pixel-wide image.
    """

    yaw_deg: float
    translation: Tuple[float, float, float]
    focal_1600: float


CAMERA_MOUNTS: Dict[str, CameraMount] = {
    'CAM_FRONT': CameraMount(0.0, (1.70, 0.02, 1.51), 1266.0),
    'CAM_FRONT_RIGHT': CameraMount(-55.0, (1.55, -0.49, 1.50), 1260.0),
    'CAM_FRONT_LEFT': CameraMount(55.0, (1.52, 0.49, 1.51), 1272.0),
    'CAM_BACK': CameraMount(180.0, (0.03, 0.01, 1.57), 809.0),
    'CAM_BACK_LEFT': CameraMount(110.0, (1.04, 0.48, 1.56), 1256.0),
    'CAM_BACK_RIGHT': CameraMount(-110.0, (1.03, -0.48, 1.56), 1259.0),
}

# Camera axes (x right, y down, z forward) expressed in the ego frame of a forward camera.
_FORWARD_CAMERA_AXES = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])

# Box faces as corner indices of the nuScenes corner order (see ``box_corners``).
_BOX_FACES = ((0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 5, 4), (3, 2, 6, 7), (0, 3, 7, 4), (1, 2, 6, 5))
_FACE_SHADE = (1.0, 0.55, 0.9, 0.9, 0.75, 0.75)
#: Index in ``_BOX_FACES`` of the face the box's heading points out of (corners 0-3, ``+x`` in the box frame).
_FRONT_FACE = 0

_SKY_BGR = np.array([235.0, 206.0, 170.0])
_GROUND_BGR = np.array([95.0, 100.0, 105.0])
_NEAR_PLANE = 0.1


def camera_to_ego_rotation(yaw_deg: float) -> np.ndarray:
    """``[3, 3]`` rotation from the camera frame to the ego frame of a level camera."""
    yaw = np.deg2rad(yaw_deg)
    rz = np.array([[np.cos(yaw), -np.sin(yaw), 0.0], [np.sin(yaw), np.cos(yaw), 0.0], [0.0, 0.0, 1.0]])
    return rz @ _FORWARD_CAMERA_AXES


def camera_intrinsic(mount: CameraMount, width: int, height: int) -> np.ndarray:
    """``[3, 3]`` pinhole intrinsics for an image of ``width`` x ``height`` pixels."""
    focal = mount.focal_1600 * width / NUSCENES_IMAGE_SIZE[0]
    return np.array([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])


def box_corners(center: np.ndarray, lwh: np.ndarray, yaw: float) -> np.ndarray:
    """``[8, 3]`` corners in the nuScenes order (first four face forward, top before bottom)."""
    l, w, h = lwh / 2.0
    x = l * np.array([1, 1, 1, 1, -1, -1, -1, -1])
    y = w * np.array([1, -1, -1, 1, 1, -1, -1, 1])
    z = h * np.array([1, 1, -1, -1, 1, 1, -1, -1])
    c, s = np.cos(yaw), np.sin(yaw)
    xy = np.stack([c * x - s * y, s * x + c * y], axis=1)
    return np.concatenate([xy, z[:, None]], axis=1) + center


def _clip_near(polygon: np.ndarray) -> np.ndarray:
    """Clip a convex polygon ``[P, 3]`` (camera frame) to ``z >= near plane`` (Sutherland-Hodgman)."""
    out = []
    for i in range(len(polygon)):
        cur, nxt = polygon[i], polygon[(i + 1) % len(polygon)]
        cur_in, nxt_in = cur[2] >= _NEAR_PLANE, nxt[2] >= _NEAR_PLANE
        if cur_in:
            out.append(cur)
        if cur_in != nxt_in:
            alpha = (_NEAR_PLANE - cur[2]) / (nxt[2] - cur[2])
            out.append(cur + alpha * (nxt - cur))
    return np.asarray(out).reshape(-1, 3)


def render_image(intrinsic: np.ndarray, global2cam: np.ndarray, corners: Sequence[np.ndarray],
                 colours: Sequence[Tuple[int, int, int]], width: int, height: int,
                 front_colours: Optional[Sequence[Optional[Tuple[int, int, int]]]] = None) -> np.ndarray:
    """Draw the boxes seen by one camera.

    Args:
        intrinsic: ``[3, 3]`` camera intrinsics.
        global2cam: ``[4, 4]`` transform from the global to the camera frame.
        corners: per box, ``[8, 3]`` global corners (see :func:`box_corners`).
        colours: per box, a BGR colour.
        width, height: image size in pixels.
        front_colours: per box, the BGR colour of its front face (the one its heading
            points out of), or None for the box colour; None: every face in the box colour.

    Returns:
        np.ndarray: ``[height, width, 3]`` uint8 BGR image.
    """
    horizon = int(round(intrinsic[1, 2]))
    rows = np.arange(height, dtype=np.float64)[:, None]
    sky = _SKY_BGR * (0.8 + 0.2 * rows / max(horizon, 1))
    ground = _GROUND_BGR * (0.8 + 0.2 * (height - rows) / max(height - horizon, 1))
    row_colours = np.where(rows < horizon, sky, ground).clip(0, 255).astype(np.uint8)  # [height, 3]
    img = np.ascontiguousarray(np.broadcast_to(row_colours[:, None, :], (height, width, 3)))

    cam_corners = [c @ global2cam[:3, :3].T + global2cam[:3, 3] for c in corners]
    order = np.argsort([-np.linalg.norm(c.mean(axis=0)) for c in cam_corners])
    limit = 8.0 * max(width, height)
    for b in order:
        cam = cam_corners[b]
        box_center = cam.mean(axis=0)
        for index, (face, shade) in enumerate(zip(_BOX_FACES, _FACE_SHADE)):
            quad = cam[list(face)]
            face_center = quad.mean(axis=0)
            if np.dot(face_center - box_center, face_center) >= 0:
                continue  # back face: its outward normal points away from the camera
            poly = _clip_near(quad)
            if len(poly) < 3:
                continue
            pix = poly @ intrinsic.T
            pix = (pix[:, :2] / pix[:, 2:3]).clip(-limit, limit)
            front = front_colours[b] if front_colours is not None and index == _FRONT_FACE else None
            colour = tuple(int(v * shade) for v in (front if front is not None else colours[b]))
            cv2.fillPoly(img, [np.round(pix).astype(np.int32)], colour, lineType=cv2.LINE_AA)
            cv2.polylines(img, [np.round(pix).astype(np.int32)], True, tuple(int(v * 0.4) for v in colour), 1,
                          lineType=cv2.LINE_AA)
    return img

