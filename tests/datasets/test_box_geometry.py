"""Pure box geometry: point-in-box, BEV overlap and projected image rectangles, on hand-checkable cases."""
import numpy as np

from projects.mmdet3d_plugin.datasets.box_geometry import bev_corners, bev_overlaps, points_in_boxes
from projects.mmdet3d_plugin.datasets.camera_geometry import box_image_rects

# A 4 x 2 x 1.5 m box, bottom centre at (10, 0, -1), heading 90 degrees: 4 m along y, 2 m along x.
BOX = np.array([[10.0, 0.0, -1.0, 4.0, 2.0, 1.5, np.pi / 2]])


def test_points_in_a_rotated_box():
    points = np.array([
        [10.0, 1.9, -0.9],  # inside: 1.9 < 2 along the heading (y)
        [10.9, 0.0, 0.4],  # inside: 0.9 < 1 across, z below the top (-1 + 1.5 = 0.5)
        [11.5, 0.0, -0.5],  # outside: 1.5 > 1 across the heading
        [10.0, 2.1, -0.5],  # outside: 2.1 > 2 along the heading
        [10.0, 0.0, -1.1],  # below the bottom face
        [10.0, 0.0, 0.6],  # above the top face
    ])
    assert points_in_boxes(points, BOX)[:, 0].tolist() == [True, True, False, False, False, False]


def test_bev_corners_of_a_rotated_box():
    corners = bev_corners(BOX)[0]
    np.testing.assert_allclose(np.sort(corners[:, 0]), [9, 9, 11, 11], atol=1e-9)
    np.testing.assert_allclose(np.sort(corners[:, 1]), [-2, -2, 2, 2], atol=1e-9)


def test_bev_overlap_uses_the_rotation():
    # An axis-aligned 2 x 2 box centred at (12, 1.5): it would overlap the 4 x 2 box if that one were not
    # rotated (its x extent would be 8..12), but the rotated box only reaches x = 11.
    near = np.array([[12.2, 1.5, 0.0, 2.0, 2.0, 1.0, 0.0]])
    touching = np.array([[11.9, 1.5, 0.0, 2.0, 2.0, 1.0, 0.0]])
    diagonal = np.array([[12.5, 2.5, 0.0, 2.0, 2.0, 1.0, np.pi / 4]])  # its closest corner is at x = 11.09
    assert bev_overlaps(BOX, np.concatenate([near, touching, diagonal])).tolist() == [[False, True, False]]
    unrotated = BOX.copy()
    unrotated[0, 6] = 0.0
    assert bev_overlaps(unrotated, near).tolist() == [[True]]
    assert bev_overlaps(BOX, BOX).tolist() == [[True]]


def test_box_image_rects_cover_the_projected_corners():
    # Camera looking along +x: (u * d, v * d, d) = (50 x - 10 y, 20 x - 10 z, x).
    lidar2img = np.array([[50.0, -10.0, 0, 0], [20.0, 0, -10.0, 0], [1.0, 0, 0, 0], [0, 0, 0, 1.0]])
    corners = np.array([[[x, y, z] for x in (9.0, 11.0) for y in (-2.0, 2.0) for z in (-1.0, 0.5)]])
    behind = corners - np.array([20.0, 0, 0])
    edge = corners + np.array([0, -45.0, 0])  # u between 89.09 and 102.2: clipped at the width 100
    rects, depth, visible = box_image_rects(np.concatenate([corners, behind, edge]), lidar2img, (40, 100))
    # u ranges over 50 -+ 10 * 2 / 9 -> [47.78, 52.22]; v over 20 -+ 10 * {-1, 0.5} / x -> [19.44, 21.11].
    assert rects[0].tolist() == [48, 19, 53, 22]
    assert depth[0] == 10.0
    assert visible.tolist() == [True, False, True]
    assert rects[2].tolist() == [89, 19, 100, 22]
