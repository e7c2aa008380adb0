"""Synthetic cameras: the 6-camera nuScenes rig and a box renderer.

Cameras use the nuScenes camera frame (x right, y down, z forward). The background is a
sky gradient above the horizon row and, below it, the ground plane ``z = 0`` of the global
frame with a checkerboard fixed in the world, so that the convergence and the spacing of
its squares tell the depth of a ground point. Every box darkens the ground around its
footprint with a soft contact shadow, which marks where it stands. Each object is then
drawn as its visible box faces, filled with the class colour and shaded per face, far
objects first.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

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

#: Side of the ground's checkerboard squares in metres; the squares are fixed in the global frame.
GROUND_SQUARE_M = 4.0
#: Brightness of the light (dark) squares relative to the plain ground: ``1 + (-)`` this.
_SQUARE_CONTRAST = 0.12
#: How far a contact shadow reaches beyond a box's footprint, metres.
SHADOW_REACH_M = 0.5
#: Share of the ground's brightness a contact shadow takes away under the box.
_SHADOW_DARKNESS = 0.55
#: Pixels of the ground computed at once (see ``render_background``).
_BAND_PIXELS = 6000
#: Corners of the bottom face of a box, in order around it (see ``box_corners``).
_BOTTOM_FACE = (2, 3, 7, 6)


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
    if (polygon[:, 2] >= _NEAR_PLANE).all():
        return polygon
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


def _to_pixels(polygon: np.ndarray, intrinsic: np.ndarray, limit: float) -> Optional[np.ndarray]:
    """Pixel coordinates ``[P', 2]`` of a convex polygon ``[P, 3]`` (camera frame) clipped to the near plane.

    Coordinates are clamped to ``[-limit, limit]``; None when less than a triangle is in front of the camera.
    """
    poly = _clip_near(polygon)
    if len(poly) < 3:
        return None
    pix = poly @ intrinsic.T
    return (pix[:, :2] / pix[:, 2:3]).clip(-limit, limit)


def pixel_rays(intrinsic: np.ndarray, global2cam: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The rays of a pinhole camera (no skew) in the global frame.

    Args:
        intrinsic: ``[3, 3]`` camera intrinsics.
        global2cam: ``[4, 4]`` rigid transform from the global to the camera frame.

    Returns:
        tuple: ``[3, 3]`` matrix taking a pixel ``(u, v, 1)`` to the global direction of its ray, and
        ``[3]`` the global camera position (inverses in closed form: LAPACK's are slow on 3 x 3).
    """
    (fx, _, cx), (_, fy, cy) = intrinsic[:2]
    inverse_intrinsic = np.array([[1.0 / fx, 0.0, -cx / fx], [0.0, 1.0 / fy, -cy / fy], [0.0, 0.0, 1.0]])
    cam2global = global2cam[:3, :3].T
    return cam2global @ inverse_intrinsic, -cam2global @ global2cam[:3, 3]


def ground_points(pixel_to_ray: np.ndarray, origin: np.ndarray, rows: np.ndarray,
                  width: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the rays of the pixels in ``rows`` meet the ground plane ``z = 0`` of the global frame.

    Arrays are float32 (a tenth of a millimetre at 2 km from the origin; half the memory traffic of
    float64) and put the coordinate first (``[2, R, width]``): numpy is several times slower on a
    trailing axis of 2 or 3.

    Args:
        pixel_to_ray: ``[3, 3]`` and origin: ``[3]``, the camera's rays (see :func:`pixel_rays`);
            the camera is above the ground.
        rows: ``[R]`` pixel rows; the columns are ``0 .. width - 1``.
        width: image width in pixels.

    Returns:
        tuple: global ``x`` and ``y`` of the ground point of every pixel ``[2, R, width]``; its footprint
        ``[2, R, width]``, how much ``x`` and ``y`` change from the pixel to its neighbours (the sum of
        the absolute changes per column and per row: the width of a pixel on the ground); whether the
        pixel's ray hits the ground at all ``[R, width]`` (where it does not, both are meaningless).
    """
    pixel_to_ray, origin = pixel_to_ray.astype(np.float32), origin.astype(np.float32)
    u = np.arange(width, dtype=np.float32)[None, :]
    v = np.asarray(rows, dtype=np.float32)[:, None]
    ray_x, ray_y, ray_z = (pixel_to_ray[i, 0] * u + pixel_to_ray[i, 1] * v + pixel_to_ray[i, 2] for i in range(3))
    hits = ray_z < -1e-9
    inverse_z = 1.0 / np.where(hits, ray_z, -1.0)
    distance = -origin[2] * inverse_z  # ray length to the ground, in units of the ray vector
    xy = np.stack([origin[0] + distance * ray_x, origin[1] + distance * ray_y])
    # xy = origin_xy - origin_z * ray_xy / ray_z, differentiated along the image columns and rows
    footprint = np.zeros_like(xy)
    for column in (0, 1):
        ratio = pixel_to_ray[2, column] * inverse_z
        footprint[0] += np.abs(distance * (pixel_to_ray[0, column] - ray_x * ratio))
        footprint[1] += np.abs(distance * (pixel_to_ray[1, column] - ray_y * ratio))
    return xy, footprint, hits


def checkerboard(xy: np.ndarray, footprint: np.ndarray, square: float) -> np.ndarray:
    """Share of light squares seen by each pixel of a ground checkerboard (box-filtered, no aliasing).

    The squares have side ``square`` and are light where ``floor(x / square) + floor(y / square)``
    is odd. The pattern is averaged over each pixel's footprint in closed form (the integral of a
    square wave, per axis), so squares smaller than a pixel fade to 0.5 instead of flickering.

    Args:
        xy: ``[2, ...]`` ground points (x, y), metres.
        footprint: ``[2, ...]`` the pixels' widths along x and y, metres (see :func:`ground_points`).
        square: side of the squares, metres.

    Returns:
        np.ndarray: ``[...]`` in ``[0, 1]`` (0: dark square, 1: light square).
    """
    position = xy / square
    width = footprint / square + 1e-3

    def triangle(x: np.ndarray) -> np.ndarray:  # integral of the +-1 square wave of period 2, up to a constant
        return np.abs(x - np.floor(x) - 0.5)

    wave = 2.0 * (triangle(0.5 * (position - 0.5 * width)) - triangle(0.5 * (position + 0.5 * width))) / width
    return 0.5 - 0.5 * wave[0] * wave[1]


#: A rectangle on the ground: centre ``[2]``, unit axes ``[2, 2]`` (rows) and half sizes ``[2]``.
Rectangle = Tuple[np.ndarray, np.ndarray, np.ndarray]


def rectangle_frame(corners: np.ndarray) -> Rectangle:
    """Centres ``[..., 2]``, unit axes ``[..., 2, 2]`` (rows) and half sizes ``[..., 2]`` of rectangles
    ``[..., 4, 2]`` given by their corners in order around each."""
    sides = np.stack([corners[..., 1, :] - corners[..., 0, :], corners[..., 2, :] - corners[..., 1, :]], axis=-2)
    lengths = np.linalg.norm(sides, axis=-1)
    return 0.5 * (corners[..., 0, :] + corners[..., 2, :]), sides / lengths[..., None], lengths / 2.0


def contact_shadow(xy: np.ndarray, footprint: Rectangle) -> np.ndarray:
    """How much a box's contact shadow darkens ground points: fully under it, fading out beyond it.

    Args:
        xy: ``[2, ...]`` global ground points (x, y).
        footprint: the box's bottom face (see :func:`rectangle_frame`).

    Returns:
        np.ndarray: ``[...]`` share of the ground's brightness taken away: the full darkness on the
        footprint, falling smoothly to 0 at :data:`SHADOW_REACH_M` outside it.
    """
    center, axes, half = footprint
    dx, dy = xy[0] - center[0], xy[1] - center[1]
    outside = [np.maximum(np.abs(axes[i, 0] * dx + axes[i, 1] * dy) - half[i], 0.0) for i in (0, 1)]
    weight = np.clip(1.0 - np.sqrt(outside[0] ** 2 + outside[1] ** 2) / SHADOW_REACH_M, 0.0, 1.0)
    return _SHADOW_DARKNESS * weight * weight * (3.0 - 2.0 * weight)


def _shadow_windows(intrinsic: np.ndarray, global2cam: np.ndarray, corners: Sequence[np.ndarray], width: int,
                    height: int) -> List[Tuple[Rectangle, int, int, int, int]]:
    """The boxes whose contact shadow can be in the image, and where.

    Returns:
        list: per such box, its footprint (bottom face, see :func:`rectangle_frame`) and the pixel
        rectangle ``row0, row1, col0, col1`` (ends excluded) that bounds its shadow's reach.
    """
    if not len(corners):
        return []
    centers, axes, half = rectangle_frame(np.stack(corners)[:, list(_BOTTOM_FACE), :2])
    signs = np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])  # [4, 2] corners of a rectangle
    reach = centers[:, None] + (signs * (half[:, None] + SHADOW_REACH_M)) @ axes  # [B, 4, 2]
    reach_cam = reach @ global2cam[:3, :2].T + global2cam[:3, 3]  # [B, 4, 3], on the ground z = 0
    depth = reach_cam[..., 2]
    pix = reach_cam[..., :2] @ intrinsic[:2, :2].T / np.maximum(depth, _NEAR_PLANE)[..., None] + intrinsic[:2, 2]
    limit = 8.0 * max(width, height)
    windows = []
    for b in np.nonzero((depth >= _NEAR_PLANE).any(axis=1))[0]:
        box_pix = pix[b] if (depth[b] >= _NEAR_PLANE).all() else _to_pixels(reach_cam[b], intrinsic, limit)
        if box_pix is None:
            continue
        (col0, row0), (col1, row1) = np.floor(box_pix.min(axis=0)), np.ceil(box_pix.max(axis=0)) + 1
        row0, row1, col0, col1 = max(int(row0), 0), min(int(row1), height), max(int(col0), 0), min(int(col1), width)
        if row0 < row1 and col0 < col1:
            windows.append(((centers[b], axes[b], half[b]), row0, row1, col0, col1))
    return windows


def _ground_rows(pixel_to_ray: np.ndarray, origin: np.ndarray, rows: np.ndarray, width: int, plain_bgr: np.ndarray,
                 shadows: Sequence[Tuple[Rectangle, int, int, int, int]]) -> np.ndarray:
    """``[R, width, 3]`` uint8 BGR ground of consecutive pixel ``rows`` ``[R]``: the plain colour ``[R, 3]`` of
    each row, modulated by the checkerboard and darkened by the contact shadows (see :func:`_shadow_windows`)."""
    xy, footprint, hits = ground_points(pixel_to_ray, origin, rows, width)
    first = int(rows[0])
    shadow = np.zeros(hits.shape, dtype=np.float32)
    for rectangle, row0, row1, col0, col1 in shadows:
        row0, row1 = max(row0 - first, 0), min(row1 - first, len(rows))
        if row0 < row1:
            window = np.s_[row0:row1, col0:col1]
            shadow[window] = np.maximum(shadow[window], contact_shadow(xy[(slice(None),) + window], rectangle))
    pattern = 1.0 + _SQUARE_CONTRAST * (2.0 * checkerboard(xy, footprint, GROUND_SQUARE_M) - 1.0)
    shade = np.where(hits, pattern * (1.0 - shadow), 1.0)
    return np.stack([(shade * plain_bgr[:, c, None]).clip(0, 255).astype(np.uint8) for c in range(3)], axis=-1)


def render_background(intrinsic: np.ndarray, global2cam: np.ndarray, corners: Sequence[np.ndarray], width: int,
                      height: int) -> np.ndarray:
    """The sky, the checkerboard ground and the contact shadows of the boxes, without the boxes.

    Rows above the horizon row (the principal point's) are the sky gradient; the rows below are the
    ground gradient, modulated by the world-fixed checkerboard and darkened by the shadows. The ground
    is computed in bands of about :data:`_BAND_PIXELS` pixels: whole-image float temporaries are too
    big for malloc to recycle, and page-faulting them in again on every call tripled the render time.

    Args:
        intrinsic: ``[3, 3]`` camera intrinsics (a level camera).
        global2cam: ``[4, 4]`` transform from the global to the camera frame.
        corners: per box, ``[8, 3]`` global corners (see :func:`box_corners`).
        width, height: image size in pixels.

    Returns:
        np.ndarray: ``[height, width, 3]`` uint8 BGR image.
    """
    horizon = int(round(intrinsic[1, 2]))
    split = min(max(horizon, 0), height)
    rows = np.arange(height, dtype=np.float64)[:, None]
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[:split] = (_SKY_BGR * (0.8 + 0.2 * rows[:split] / max(horizon, 1))).clip(0, 255).astype(np.uint8)[:, None]
    plain_ground = _GROUND_BGR * (0.8 + 0.2 * (height - rows) / max(height - horizon, 1))  # [height, 3]
    pixel_to_ray, origin = pixel_rays(intrinsic, global2cam)
    shadows = _shadow_windows(intrinsic, global2cam, corners, width, height)
    band = max(1, _BAND_PIXELS // width)
    for start in range(split, height, band):
        stop = min(start + band, height)
        img[start:stop] = _ground_rows(pixel_to_ray, origin, np.arange(start, stop), width, plain_ground[start:stop],
                                       shadows)
    return img


def render_image(intrinsic: np.ndarray, global2cam: np.ndarray, corners: Sequence[np.ndarray],
                 colours: Sequence[Tuple[int, int, int]], width: int, height: int,
                 front_colours: Optional[Sequence[Optional[Tuple[int, int, int]]]] = None) -> np.ndarray:
    """Draw the boxes seen by one camera over the background of :func:`render_background`.

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
    img = render_background(intrinsic, global2cam, corners, width, height)
    if not len(corners):
        return img
    cam = np.stack(corners) @ global2cam[:3, :3].T + global2cam[:3, 3]  # [B, 8, 3]
    faces = cam[:, list(_BOX_FACES)]  # [B, 6, 4, 3]
    box_centers, face_centers = cam.mean(axis=1), faces.mean(axis=2)
    # a face is drawn when its outward normal points towards the camera
    facing = np.einsum('bfk,bfk->bf', face_centers - box_centers[:, None], face_centers) < 0  # [B, 6]
    limit = 8.0 * max(width, height)
    for b in np.argsort(-np.linalg.norm(box_centers, axis=1)):  # far to near
        if (cam[b, :, 2] < _NEAR_PLANE).all():
            continue  # behind the camera
        for index in np.nonzero(facing[b])[0]:
            pix = _to_pixels(faces[b, index], intrinsic, limit)
            if pix is None:
                continue
            front = front_colours[b] if front_colours is not None and index == _FRONT_FACE else None
            colour = tuple(int(v * _FACE_SHADE[index]) for v in (front if front is not None else colours[b]))
            cv2.fillPoly(img, [np.round(pix).astype(np.int32)], colour, lineType=cv2.LINE_AA)
            cv2.polylines(img, [np.round(pix).astype(np.int32)], True, tuple(int(v * 0.4) for v in colour), 1,
                          lineType=cv2.LINE_AA)
    return img
