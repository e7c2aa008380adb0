"""Query projection against hand-computed cases (see conftest.py for the camera rigs)."""
import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.models.aqr.projection import bev_cells, project_reference_points
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry


def _project(rig, metas, points, bev_shape=(8, 8), camera_shape=None):
    """points: per sample a list of metric points -> projection_info."""
    ref = torch.tensor(rig['normalise'](points), dtype=torch.float32)
    if ref.dim() == 2:
        ref = ref[None]
    num_views = len(metas[0]['lidar2img'])
    camera_shape = camera_shape or (num_views, 4, 6)
    geometry = CameraGeometry.from_metas(metas)
    return project_reference_points(ref, rig['pc_range'], bev_shape, camera_shape, geometry)


def test_point_in_front_camera_maps_to_hand_computed_cells(rig):
    # (4, 0, 0): u = 24, v = 16 -> stride 32/4 = 48/6 = 8 -> cell (2, 3).
    # normalised x = 0.7 -> column 5, y = 0.5 -> row 4 on an 8x8 BEV.
    info = _project(rig, [rig['meta']([rig['front']()])], [[4.0, 0.0, 0.0]])
    assert info['visible'].tolist() == [[True]]
    assert info['pts_pers_idx'].tolist() == [[[0, 2, 3]]]
    assert info['pts_bev'].tolist() == [[[4, 5]]]
    assert info['pts_idx'].tolist() == [[37]]
    assert info['pts_pers_idx'].dtype == torch.long and info['visible'].dtype == torch.bool


def test_point_behind_camera_is_invisible_even_if_division_lands_in_image(rig):
    # (-4, 0, 0) in the front camera: (u*d, v*d, d) = (-96, -64, -4) -> u, v = 24, 16 would be
    # inside the image, but the point is behind the camera.
    info = _project(rig, [rig['meta']([rig['front']()])], [[-4.0, 0.0, 0.0]])
    assert info['visible'].tolist() == [[False]]
    assert info['pts_pers_idx'].tolist() == [[[-1, -1, -1]]]


def test_point_outside_image_is_invisible(rig):
    # (1, -5, 0): u = 24 + 40 = 64 >= 48.
    info = _project(rig, [rig['meta']([rig['front']()])], [[1.0, -5.0, 0.0]])
    assert info['visible'].tolist() == [[False]]
    assert info['pts_pers_idx'].tolist() == [[[-1, -1, -1]]]


def test_view_is_the_first_that_sees_the_point(rig):
    # views [back, front]
    metas = [rig['meta']([rig['back'](), rig['front']()])]
    # (4, 2, 1): behind the back camera; front: u = 24 - 16/4 = 20, v = 16 - 8/4 = 14 -> nearest rays (2, 3)
    # (v / 8 = 1.75, u / 8 = 2.5 rounds up). (-4, 2, 0): back camera: d = 4, u = (96 + 16)/4 = 28,
    # v = 64/4 = 16 -> (2, 4) (u / 8 = 3.5).
    info = _project(rig, metas, [[4.0, 2.0, 1.0], [-4.0, 2.0, 0.0]])
    assert info['visible'].tolist() == [[True, True]]
    assert info['pts_pers_idx'].tolist() == [[[1, 2, 3], [0, 2, 4]]]
    # two views that both see the point: the first one wins
    both = _project(rig, [rig['meta']([rig['front'](), rig['front']()])], [[4.0, 0.0, 0.0]])
    assert both['pts_pers_idx'].tolist() == [[[0, 2, 3]]]


def test_camera_cell_is_the_one_whose_ray_is_nearest_the_pixel(rig):
    """The position embedding puts cell j's ray through pixel j * stride; every pixel column gets the nearest one."""
    stride = 8.0  # 48 pixels, 6 feature columns
    columns = np.arange(0.5, 48.0, 1.0)
    # front camera at depth x = 3 (|y| <= 9 stays in the point cloud range): u = 24 - 8 y / 3, v = 16
    points = [[3.0, (24.0 - u) * 3.0 / 8.0, 0.0] for u in columns]
    info = _project(rig, [rig['meta']([rig['front']()])], points)
    centres = np.arange(6) * stride
    nearest = np.abs(columns[:, None] - centres[None]).argmin(1)
    assert info['visible'].all()
    assert info['pts_pers_idx'][0, :, 2].tolist() == nearest.tolist()
    assert info['pts_pers_idx'][0, :, 1].tolist() == [2] * len(columns)


def test_padding_is_not_image_and_stride_comes_from_pad_shape(rig):
    # image 24x48 padded to 32x48, features 4x6 -> stride 8.
    metas = [rig['meta']([rig['front']()], img_shape=(24, 48, 3), pad_shape=(32, 48, 3))]
    # (2, 0, -1): v = 16 + 4 = 20 -> visible, h = round(2.5) = 3. (2, 0, -3): v = 28 -> in the padding only.
    info = _project(rig, metas, [[2.0, 0.0, -1.0], [2.0, 0.0, -3.0]])
    assert info['visible'].tolist() == [[True, False]]
    assert info['pts_pers_idx'][0, 0].tolist() == [0, 3, 3]


def test_feature_cell_uses_actual_feature_shape(rig):
    # features 8x6 on a 32x48 image: stride (4, 8); (4, 0, 0): v = 16 -> h = 4, u = 24 -> w = 3.
    info = _project(rig, [rig['meta']([rig['front']()])], [[4.0, 0.0, 0.0]], camera_shape=(1, 8, 6))
    assert info['pts_pers_idx'].tolist() == [[[0, 4, 3]]]


def test_single_image_shape_for_all_views_is_accepted(rig):
    meta = dict(lidar2img=[rig['front'](), rig['back']()], img_shape=(32, 48, 3), pad_shape=(32, 48, 3))
    info = _project(rig, [meta], [[-4.0, 2.0, 0.0]])
    assert info['pts_pers_idx'].tolist() == [[[1, 2, 4]]]


def test_batch_uses_each_samples_own_matrices(rig):
    metas = [rig['meta']([rig['front']()]), rig['meta']([rig['back']()])]
    ref = torch.tensor(rig['normalise']([[4.0, 0.0, 0.0]]), dtype=torch.float32)[None].repeat(2, 1, 1)
    info = project_reference_points(ref, rig['pc_range'], (8, 8), (1, 4, 6), CameraGeometry.from_metas(metas))
    assert info['visible'].tolist() == [[True], [False]]
    assert info['pts_pers_idx'].tolist() == [[[0, 2, 3]], [[-1, -1, -1]]]


def test_bev_cells_x_is_column_y_is_row_and_clamped():
    ref = torch.tensor([[[0.7, 0.3, 0.5], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.2, -0.1, 0.5]]])
    pts_bev, pts_idx = bev_cells(ref, (4, 8))
    assert pts_bev.tolist() == [[[1, 5], [3, 7], [0, 0], [0, 7]]]
    assert pts_idx.tolist() == [[13, 31, 0, 7]]


def test_bad_inputs_raise_clear_errors(rig):
    ref, front = torch.rand(1, 3, 3), [rig['meta']([rig['front']()])]
    with pytest.raises(KeyError, match='lidar2img'):
        CameraGeometry.from_metas([dict(img_shape=(32, 48, 3))])
    with pytest.raises(ValueError, match='views'):
        project_reference_points(ref, rig['pc_range'], (8, 8), (2, 4, 6), CameraGeometry.from_metas(front))
    with pytest.raises(ValueError, match='img_metas'):
        project_reference_points(ref, rig['pc_range'], (8, 8), (1, 4, 6), CameraGeometry.from_metas(front * 2))
    with pytest.raises(ValueError, match='pc_range'):
        project_reference_points(ref, [0, 0, 0, 1, 1], (8, 8), (1, 4, 6), CameraGeometry.from_metas(front))
    with pytest.raises(ValueError, match='reference_points'):
        project_reference_points(torch.rand(1, 3, 2), rig['pc_range'], (8, 8), (1, 4, 6),
                                 CameraGeometry.from_metas(front))
