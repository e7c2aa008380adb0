"""Geometric augmentations on a real synthetic sample: boxes keep their points, points keep their pixels."""
import numpy as np
import pytest
from mmcv.utils import build_from_cfg
from mmdet.datasets.builder import PIPELINES

from projects.mmdet3d_plugin.datasets.box_geometry import points_in_boxes
from projects.mmdet3d_plugin.datasets.camera_geometry import project_points

GEOMETRIC_TRANSFORMS = {
    'rot_scale_trans_all': dict(type='GlobalRotScaleTransAll', rot_range=[0.7, 0.7], scale_ratio_range=[1.08, 1.08],
                                translation_std=[0.5, 0.5, 0.5]),
    'rot_scale_trans_image': dict(type='GlobalRotScaleTransImage', rot_range=[-0.35, -0.35],
                                  scale_ratio_range=[0.93, 0.93], translation_std=[0.3, 0.3, 0.1],
                                  reverse_angle=True, flip_dx_ratio=1.0, flip_dy_ratio=1.0),
    'flip_horizontal': dict(type='CustomRandomFlip3D', flip_ratio_bev_horizontal=1.0),
    'flip_vertical': dict(type='CustomRandomFlip3D', flip_ratio_bev_vertical=1.0),
}


def _state(results):
    points = results['points'].coord.numpy().astype(np.float64)
    boxes = results['gt_bboxes_3d']
    return dict(points=points, boxes=boxes.tensor.numpy().astype(np.float64),
                centres=boxes.gravity_center.numpy().astype(np.float64),
                inside=points_in_boxes(points, boxes.tensor.numpy()),
                lidar2img=[np.array(m) for m in results['lidar2img']],
                lidar2cam=[np.array(m) for m in results['lidar2cam']])


def _homogeneous_projections(points, lidar2img):
    return np.concatenate([points, np.ones((len(points), 1))], axis=1) @ lidar2img.T


@pytest.mark.parametrize('name', sorted(GEOMETRIC_TRANSFORMS))
def test_transform_keeps_points_in_their_boxes_and_on_their_pixels(loaded_sample, name):
    results = loaded_sample()
    before = _state(results)
    results = build_from_cfg(dict(GEOMETRIC_TRANSFORMS[name]), PIPELINES)(results)
    after = _state(results)
    assert before['inside'].sum(axis=0).min() > 0  # every box has LiDAR points
    assert np.abs(after['points'] - before['points']).max() > 1.0  # the scene really moved
    # The boxes moved with their points: the same points are inside the same boxes.
    np.testing.assert_array_equal(after['inside'], before['inside'])
    for view in range(len(before['lidar2img'])):
        # Every point and every box centre projects to the same homogeneous image coordinates (pixel and depth).
        for key in ('points', 'centres'):
            np.testing.assert_allclose(_homogeneous_projections(after[key], after['lidar2img'][view]),
                                       _homogeneous_projections(before[key], before['lidar2img'][view]),
                                       rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(results['cam_intrinsic'][view] @ after['lidar2cam'][view], after['lidar2img'][view],
                                   atol=1e-6)
    assert results['extrinsics'] is results['lidar2cam']  # the aliases of the dataset still name the same lists


def test_flips_are_involutions(loaded_sample):
    results = loaded_sample()
    before = _state(results)
    flip = build_from_cfg(dict(type='CustomRandomFlip3D', flip_ratio_bev_horizontal=1.0,
                               flip_ratio_bev_vertical=1.0), PIPELINES)
    once = _state(flip(results))
    assert np.abs(once['points'][:, :2] + before['points'][:, :2]).max() < 1e-4  # both axes mirrored
    twice = _state(flip(results))  # the flags stored by the first call are applied again
    assert results['transformation_3d_flow'] == ['HF', 'VF', 'HF', 'VF']
    np.testing.assert_allclose(twice['points'], before['points'], atol=1e-5)
    yaw_error = np.angle(np.exp(1j * (twice['boxes'][:, 6] - before['boxes'][:, 6])))
    np.testing.assert_allclose(yaw_error, 0, atol=1e-5)
    np.testing.assert_allclose(twice['boxes'][:, [0, 1, 2, 3, 4, 5, 7, 8]],
                               before['boxes'][:, [0, 1, 2, 3, 4, 5, 7, 8]], atol=1e-4)
    for view in range(len(before['lidar2img'])):
        np.testing.assert_allclose(twice['lidar2img'][view], before['lidar2img'][view], atol=1e-9)


def test_rotation_follows_mmdet3d_box_convention(loaded_sample):
    """A positive angle turns the scene counter-clockwise: yaw grows by the angle, (x, y) rotates with it."""
    results = loaded_sample()
    before = _state(results)
    build_from_cfg(dict(type='GlobalRotScaleTransAll', rot_range=[0.5, 0.5], scale_ratio_range=[1.0, 1.0]),
                   PIPELINES)(results)
    after = _state(results)
    cos, sin = np.cos(0.5), np.sin(0.5)
    expected_xy = before['boxes'][:, :2] @ np.array([[cos, sin], [-sin, cos]])
    np.testing.assert_allclose(after['boxes'][:, :2], expected_xy, atol=1e-4)
    np.testing.assert_allclose(after['boxes'][:, 6], before['boxes'][:, 6] + 0.5, atol=1e-5)
    assert results['pcd_rotation_angle'] == 0.5 and results['transformation_3d_flow'] == ['R', 'S', 'T']


def test_transforms_work_without_boxes_in_test_mode(loaded_sample):
    results = loaded_sample()
    for key in results.pop('bbox3d_fields'):
        results.pop(key)
    results['bbox3d_fields'] = []
    points = results['points'].coord.numpy().astype(np.float64)
    projected = _homogeneous_projections(points, results['lidar2img'][0])
    for cfg in GEOMETRIC_TRANSFORMS.values():
        build_from_cfg(dict(cfg), PIPELINES)(results)
    moved = results['points'].coord.numpy().astype(np.float64)
    assert np.abs(moved - points).max() > 1.0
    np.testing.assert_allclose(_homogeneous_projections(moved, results['lidar2img'][0]), projected, rtol=1e-5,
                               atol=1e-3)


def test_image_transform_keeps_object_points_on_their_content(loaded_sample, cmt):
    """ResizeCropFlipImage: the pixel under a LiDAR point after augmentation shows what it showed before."""
    np.random.seed(3)
    conf = dict(cmt.DATA_AUG_CONF, rot_lim=(-10.0, 10.0), bot_pct_lim=(0.0, 0.1))
    transform = build_from_cfg(dict(type='ResizeCropFlipImage', data_aug_conf=conf, training=True, pic_wise=True),
                               PIPELINES)
    for _ in range(3):
        results = loaded_sample()
        state = _state(results)
        object_points = state['points'][state['inside'].any(axis=1)]
        old_images, old_lidar2img = results['img'], state['lidar2img']
        results = transform(results)
        differences = []
        for view, (old, new) in enumerate(zip(old_images, results['img'])):
            assert new.shape == (*conf['final_dim'], 3)
            old_uv, depth = project_points(object_points, old_lidar2img[view])
            new_uv, _ = project_points(object_points, results['lidar2img'][view])
            keep = (depth > 0.5) & _inside(old_uv, old.shape, 2) & _inside(new_uv, new.shape, 2)
            old_px = old[np.round(old_uv[keep, 1]).astype(int), np.round(old_uv[keep, 0]).astype(int)]
            new_px = new[np.round(new_uv[keep, 1]).astype(int), np.round(new_uv[keep, 0]).astype(int)]
            differences.append(np.abs(old_px.astype(int) - new_px.astype(int)).max(axis=1))
        differences = np.concatenate(differences)
        assert len(differences) > 100
        assert np.median(differences) <= 8 and np.mean(differences < 40) > 0.85


def _inside(uv, shape, margin):
    return (uv[:, 0] >= margin) & (uv[:, 0] < shape[1] - margin) & (uv[:, 1] >= margin) & (uv[:, 1] < shape[0] - margin)
