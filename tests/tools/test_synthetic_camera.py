"""The synthetic cameras' monocular depth cues: a checkerboard fixed on the ground and contact shadows."""
from typing import Tuple

import numpy as np

from tools.data_converter.synthetic.camera import (GROUND_SQUARE_M, box_corners, camera_to_ego_rotation,
                                                   render_background, render_image)

CAR_BGR = (40, 40, 200)


def pinhole(focal: float, width: int, height: int) -> np.ndarray:
    """``[3, 3]`` intrinsics with the principal point in the image centre."""
    return np.array([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])


def level_camera(x: float, y: float, yaw_deg: float, height: float = 1.5) -> np.ndarray:
    """``[4, 4]`` global-to-camera transform of a level camera at ``(x, y, height)`` looking along ``yaw_deg``."""
    cam2global = np.eye(4)
    cam2global[:3, :3] = camera_to_ego_rotation(yaw_deg)
    cam2global[:3, 3] = [x, y, height]
    return np.linalg.inv(cam2global)


def pixel_of(intrinsic: np.ndarray, global2cam: np.ndarray, point: Tuple[float, float, float]) -> Tuple[int, int]:
    """(row, column) of the pixel a global point projects to."""
    cam = global2cam[:3, :3] @ np.asarray(point) + global2cam[:3, 3]
    assert cam[2] > 1.0
    u, v = (intrinsic @ cam)[:2] / cam[2]
    return int(round(v)), int(round(u))


def brightness(image: np.ndarray, row: int, col: int) -> float:
    """Mean BGR of the 3 x 3 pixels around (row, col)."""
    assert 1 <= row < image.shape[0] - 1 and 1 <= col < image.shape[1] - 1
    return float(image[row - 1:row + 2, col - 1:col + 2].mean())


def test_ground_squares_are_fixed_in_the_world():
    """The centre of a dark square stays darker than the centre of the light square beside it from every pose,
    including one moved by exactly one square, where a pattern fixed to the camera would swap them."""
    width, height = 320, 180
    intrinsic = pinhole(160.0, width, height)
    dark = (2.5 * GROUND_SQUARE_M, 0.5 * GROUND_SQUARE_M, 0.0)  # floor(x / square) + floor(y / square) = 2
    light = (2.5 * GROUND_SQUARE_M, -0.5 * GROUND_SQUARE_M, 0.0)  # ... = 1
    for pose in ((0.0, 0.0, 0.0), (GROUND_SQUARE_M, 0.0, 0.0), (1.3, -0.7, 25.0), (-2.0, 1.5, -20.0)):
        global2cam = level_camera(*pose)
        image = render_background(intrinsic, global2cam, [], width, height)
        dark_value = brightness(image, *pixel_of(intrinsic, global2cam, dark))
        light_value = brightness(image, *pixel_of(intrinsic, global2cam, light))
        assert light_value - dark_value > 12, pose


def test_ground_squares_fade_to_plain_ground_near_the_horizon():
    """Squares are averaged over each pixel: near the horizon, where many fall in one pixel, the ground is
    uniform along a row instead of aliasing; close to the camera the squares are crisp."""
    width, height = 320, 180
    image = render_background(pinhole(160.0, width, height), level_camera(0.7, 0.3, 10.0), [], width,
                              height).astype(np.float64)
    horizon = height // 2
    assert image[horizon + 1:horizon + 3].std(axis=1).max() < 1.5
    assert np.ptp(image[height - 5:].mean(axis=2), axis=1).min() > 15


def test_sky_is_the_plain_gradient_and_ground_is_textured():
    """Above the horizon: the row gradient of the sky, the same from any pose and with any objects."""
    width, height = 320, 180
    intrinsic = pinhole(160.0, width, height)
    car = [box_corners(np.array([8.0, 1.0, 0.85]), np.array([4.6, 1.95, 1.7]), 0.3)]
    images = [render_background(intrinsic, level_camera(0.0, 0.0, 0.0), car, width, height),
              render_background(intrinsic, level_camera(50.0, -20.0, 140.0), [], width, height)]
    horizon = height // 2
    for image in images:
        sky = image[:horizon].astype(np.float64)
        assert (sky == sky[:, :1]).all()  # constant along every row
        assert image[0, 0].tolist() == [188, 164, 136]  # 0.8 x the sky colour (235, 206, 170) at the top
        assert (np.diff(sky[:, 0], axis=0) >= 0).all()  # brightening towards the horizon
        assert (np.ptp(image[horizon + 10:].mean(axis=2), axis=1) > 10).mean() > 0.8  # ground rows cross squares
    assert (images[0][:horizon] == images[1][:horizon]).all()


def test_a_contact_shadow_darkens_the_ground_just_in_front_of_an_object():
    """The ground 15 cm in front of a car, visible below its silhouette, is darker with the car than without;
    1 m in front, beyond the shadow's reach, it is unchanged."""
    width, height = 640, 360
    intrinsic = pinhole(320.0, width, height)
    global2cam = level_camera(0.0, 0.0, 0.0)
    center, lwh = np.array([6.0, 0.0, 0.85]), np.array([4.6, 1.95, 1.7])
    near_face = center[0] - lwh[0] / 2
    with_car = render_image(intrinsic, global2cam, [box_corners(center, lwh, 0.0)], [CAR_BGR], width, height)
    without = render_image(intrinsic, global2cam, [], [], width, height)

    row, col = pixel_of(intrinsic, global2cam, (near_face - 0.15, 0.0, 0.0))
    edge_row, _ = pixel_of(intrinsic, global2cam, (near_face, 0.0, 0.0))
    assert row - edge_row >= 4  # clear of the box's bottom edge
    shadowed = with_car[row - 1:row + 2, col - 1:col + 2].astype(np.float64)
    assert np.ptp(shadowed.mean(axis=(0, 1))) < 20  # grey ground, not the car's red
    assert brightness(with_car, row, col) < brightness(without, row, col) - 20

    far_row, far_col = pixel_of(intrinsic, global2cam, (near_face - 1.0, 0.0, 0.0))
    assert (with_car[far_row, far_col] == without[far_row, far_col]).all()
