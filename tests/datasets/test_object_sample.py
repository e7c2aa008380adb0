"""UnifiedDataBaseSampler + UnifiedObjectSample: pasted objects bring their points and land on their own pixels."""
import copy

import mmcv
import numpy as np
import pytest
from mmcv.utils import build_from_cfg
from mmdet.datasets.builder import PIPELINES
from mmdet3d.datasets.builder import OBJECTSAMPLERS

from projects.mmdet3d_plugin.datasets.box_geometry import bev_overlaps, points_in_boxes
from projects.mmdet3d_plugin.datasets.camera_geometry import box_image_rects


@pytest.fixture
def sampler_cfg(created_data, cmt):
    return cmt.db_sampler_cfg(created_data['dbinfos'])


def _sample(loaded_sample, sampler_cfg, mixup_rate=-1.0, sample_2d=True, seed=0):
    np.random.seed(seed)
    transform = build_from_cfg(dict(type='UnifiedObjectSample', sample_2d=sample_2d, mixup_rate=mixup_rate,
                                    db_sampler=sampler_cfg), PIPELINES)
    before = loaded_sample()
    after = transform(loaded_sample())
    return before, after, transform.db_sampler


def _sampled_records(sampler, boxes):
    """The database record of each sampled box (matched by its box values)."""
    records = [r for rs in sampler.db_infos.values() for r in rs]
    return [next(r for r in records if np.allclose(r['box3d_lidar'], box, atol=1e-5)) for box in boxes]


def test_sampler_draws_collision_free_objects_up_to_the_group_sizes(sampler_cfg, cmt):
    sampler = build_from_cfg(copy.deepcopy(sampler_cfg), OBJECTSAMPLERS)
    scene_box = np.array([[0.0, 0.0, -1.8, 4.0, 2.0, 1.6, 0.0, 0.0, 0.0]], dtype=np.float32)
    np.random.seed(1)
    sampled = sampler.sample_all(scene_box, np.array([0]), with_img=True)
    boxes, labels = sampled['gt_bboxes_3d'], sampled['gt_labels_3d']
    overlaps = bev_overlaps(boxes, np.concatenate([scene_box, boxes]))
    assert not overlaps[:, 0].any() and overlaps[:, 1:].sum() == len(boxes)  # each box overlaps only itself
    for label, count in zip(*np.unique(labels, return_counts=True)):
        assert count <= sampler_cfg['sample_groups'][cmt.CLASS_NAMES[label]] - (label == 0)
    points = sampled['points'].coord.numpy()
    inside = points_in_boxes(points, boxes)
    np.testing.assert_array_equal(inside.argmax(axis=1), sampled['points_box_index'])
    assert inside.any(axis=1).all()
    assert len(sampled['images']) == len(boxes) and all(isinstance(p, dict) for p in sampled['images'])


def test_points_of_sampled_objects_replace_the_scene_points_in_their_boxes(loaded_sample, sampler_cfg):
    before, after, sampler = _sample(loaded_sample, sampler_cfg)
    num_scene = len(before['gt_bboxes_3d'])
    boxes = after['gt_bboxes_3d'].tensor.numpy()
    assert len(boxes) > num_scene and len(after['gt_labels_3d']) == len(boxes)
    np.testing.assert_array_equal(boxes[:num_scene], before['gt_bboxes_3d'].tensor.numpy())
    assert not np.triu(bev_overlaps(boxes, boxes), k=1).any()
    inside = points_in_boxes(after['points'].coord.numpy(), boxes[num_scene:])
    for column, record in enumerate(_sampled_records(sampler, boxes[num_scene:])):
        assert inside[:, column].sum() == record['num_points_in_gt']  # only the database points are in the box
    kept = ~points_in_boxes(before['points'].coord.numpy(), boxes[num_scene:]).any(axis=1)
    assert len(after['points']) == kept.sum() + sum(r['num_points_in_gt'] for r in _sampled_records(sampler, boxes[
        num_scene:]))


@pytest.mark.parametrize('mixup_rate', [-1.0, 0.5])
def test_image_patches_are_pasted_where_the_sampled_boxes_project(loaded_sample, sampler_cfg, mixup_rate):
    before, after, sampler = _sample(loaded_sample, sampler_cfg, mixup_rate)
    num_scene = len(before['gt_bboxes_3d'])
    boxes = after['gt_bboxes_3d']
    records = _sampled_records(sampler, boxes.tensor.numpy()[num_scene:])
    corners = boxes.corners.numpy()
    checked = 0
    for view, camera in enumerate(after['camera_names']):
        rects, depth, visible = box_image_rects(corners, after['lidar2img'][view], after['img'][view].shape[:2])
        for index, record in enumerate(records, start=num_scene):
            patch_info = record['image_patches'].get(camera)
            if not visible[index] or patch_info is None:
                continue
            # Same rig, same LiDAR-frame pose: the box covers exactly the rectangle of its source image patch.
            assert tuple(rects[index]) == tuple(patch_info['rect'])
            # Skip boxes painted over by a nearer box, and (when blending) boxes blended over a farther pasted one;
            # farther scene boxes only restore their own pixels and do not matter.
            overlapping = [j for j in np.nonzero(visible)[0]
                           if j != index and _intersect(rects[j], rects[index])
                           and (depth[j] < depth[index] or (mixup_rate >= 0 and j >= num_scene))]
            if overlapping:
                continue
            x1, y1, x2, y2 = rects[index]
            patch = mmcv.imread(f'{sampler.data_root}/{patch_info["path"]}', 'unchanged').astype(np.float64)
            region = after['img'][view][y1:y2, x1:x2].astype(np.float64)
            original = before['img'][view][y1:y2, x1:x2].astype(np.float64)
            expected = patch if mixup_rate < 0 else (1 - mixup_rate) * original + mixup_rate * patch
            assert np.abs(region - expected).max() <= 1.0
            checked += 1
    assert checked >= 3
    # Outside every box rectangle the images are untouched.
    for view in range(len(after['img'])):
        rects, _, visible = box_image_rects(corners, after['lidar2img'][view], after['img'][view].shape[:2])
        untouched = np.ones(after['img'][view].shape[:2], dtype=bool)
        for x1, y1, x2, y2 in rects[visible]:
            untouched[y1:y2, x1:x2] = False
        np.testing.assert_array_equal(after['img'][view][untouched], before['img'][view][untouched])


def _intersect(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_without_sample_2d_the_images_are_untouched(loaded_sample, sampler_cfg):
    before, after, _ = _sample(loaded_sample, sampler_cfg, sample_2d=False)
    assert len(after['gt_bboxes_3d']) > len(before['gt_bboxes_3d'])
    for old, new in zip(before['img'], after['img']):
        np.testing.assert_array_equal(old, new)


def test_bad_database_inputs_are_named(sampler_cfg, tmp_path, loaded_sample):
    with pytest.raises(FileNotFoundError, match='GT database info file not found.*missing.pkl'):
        build_from_cfg(dict(sampler_cfg, info_path=str(tmp_path / 'missing.pkl')), OBJECTSAMPLERS)
    with pytest.raises(ValueError, match='load_dim=4'):
        build_from_cfg(dict(sampler_cfg, points_loader=dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=4,
                                                            use_dim=4)), OBJECTSAMPLERS)
    with pytest.raises(ValueError, match='unknown prepare step'):
        build_from_cfg(dict(sampler_cfg, prepare=dict(filter_by_colour=1)), OBJECTSAMPLERS)
    transform = build_from_cfg(dict(type='UnifiedObjectSample', sample_2d=True, db_sampler=sampler_cfg), PIPELINES)
    results = loaded_sample()
    del results['img']
    with pytest.raises(KeyError, match="'img'"):
        transform(results)


def test_a_scene_without_boxes_gets_objects_too(loaded_sample, sampler_cfg):
    """Empty ground truth: every group is filled from the database, without error."""
    transform = build_from_cfg(dict(type='UnifiedObjectSample', sample_2d=True, db_sampler=sampler_cfg), PIPELINES)
    results = loaded_sample()
    results['gt_bboxes_3d'] = results['gt_bboxes_3d'][np.zeros(len(results['gt_bboxes_3d']), dtype=bool)]
    results['gt_labels_3d'] = results['gt_labels_3d'][:0]
    np.random.seed(2)
    results = transform(results)
    assert len(results['gt_bboxes_3d']) == len(results['gt_labels_3d']) > 0
    assert results['gt_bboxes_3d'].tensor.shape[1] == 9
