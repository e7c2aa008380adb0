"""The corruptions that lie: ghosts with their shadows, yawed views, a misaligned LiDAR, and both lies at once."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch
from mmcv import Config
from mmcv.utils import build_from_cfg
from mmdet.datasets.builder import PIPELINES
from mmdet3d.core.points import LiDARPoints

from projects.mmdet3d_plugin.datasets.box_geometry import bev_overlaps, box_corners, points_in_boxes
from projects.mmdet3d_plugin.datasets.corruption_config import add_train_corruptions, corrupt_config, insert_corruption
from projects.mmdet3d_plugin.datasets.corruption_geometry import (camera_forward_yaw, lidar_misalignment,
                                                                  segments_through_boxes, yaw_token_shift)
from projects.mmdet3d_plugin.datasets.pipelines.corruption import (AUGMENTATION_META_KEYS, CORRUPTION_KEY,
                                                                   MISALIGNMENT_SHIFT_M)
from projects.mmdet3d_plugin.datasets.pipelines.corruption_spec import VIEW_YAW_DEG, parse_corruption
from projects.mmdet3d_plugin.datasets.pipelines.random_corruption import RandomSensorCorruption
from projects.mmdet3d_plugin.models.aqr.routing_targets import count_points_in_boxes
from projects.mmdet3d_plugin.models.aqr.sensor_lies import ghost_boxes
from tools.cli.corruption import corruption_spec
from tools.data_converter.synthetic.camera import CAMERA_MOUNTS, NUSCENES_IMAGE_SIZE

DEMO_CONFIG = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs', 'demo',
                       'cmt_synthetic_tiny.py')
#: camera tokens per view of the demo (its config: 6 x 12 at 96 x 192)
DEMO_TOKENS = (6, 12)
#: the synthetic set's point cloud range (objects within 22 m)
RANGE = [-30.0, -30.0, -5.0, 30.0, 30.0, 3.0]


@pytest.fixture
def database(created_data, cmt):
    return cmt.db_sampler_cfg(created_data['dbinfos'])


def _corruption(spec, **options):
    return build_from_cfg(dict(parse_corruption(spec), **options), PIPELINES)


def _ghosted(loaded_sample, database, spec='lidar_ghost:3', seed=0):
    before = loaded_sample()
    after = _corruption(spec, ghost_database=database, point_cloud_range=RANGE, seed=seed)(loaded_sample())
    return before, after, after[CORRUPTION_KEY]


@pytest.mark.parametrize('spec, expected', [
    ('lidar_ghost:3', dict(mode='lidar_ghost', num_ghosts=3)),
    ('view_yaw:2:20', dict(mode='view_yaw', num_views=2, yaw_deg=20.0)),
    ('lidar_misalign:0.4:2', dict(mode='lidar_misalign', frame_prob=0.4, rotation_deg=2.0)),
    ('mixed_lie:120', dict(mode='mixed_lie', sector_deg=120.0)),
])
def test_parse_the_lies(spec, expected):
    assert parse_corruption(spec) == dict(type='SensorCorruption', **expected)
    assert corruption_spec(f' {spec} ') == spec


@pytest.mark.parametrize('spec, message', [
    ('view_yaw:2', 'needs yaw_deg'), ('view_yaw:2:20:1', r'takes 2 argument\(s\), view_yaw:V:DEG'),
    ('view_yaw:0:20', 'num_views must be'), ('view_yaw:2:120', 'yaw_deg must be'), ('lidar_ghost:0', 'num_ghosts'),
    ('lidar_ghost:2.5', 'not a number of ghost objects'), ('lidar_misalign:1.5:2', 'frame_prob must be'),
    ('lidar_misalign:0.2', 'needs rotation_deg'), ('mixed_lie', 'needs sector_deg'), ('mixed_lie:200', 'sector_deg'),
    ('lidar_drop:1:2', 'takes no argument'),
])
def test_ill_formed_lies_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_corruption(spec)


def test_segments_through_boxes():
    box = np.array([[10.0, 0.0, -2.0, 2.0, 2.0, 2.0, 0.3]])  # 9..11 m ahead, 0..2 m above its bottom at -2
    points = np.array([[20.0, 0.0, -1.0],  # behind it, its ray through the box: hit
                       [5.0, 0.0, -1.0],  # in front of it: no
                       [10.0, 0.0, -1.0],  # inside: hit
                       [20.0, 5.0, -1.0],  # beside its shadow: no
                       [20.0, 0.0, 3.0],  # above it (the ray passes over the top): no
                       [30.0, 0.0, -5.5]])  # ground far behind, ray descending through the box: hit
    assert segments_through_boxes(points, box)[:, 0].tolist() == [True, False, True, False, False, True]
    assert segments_through_boxes(points, np.zeros((0, 7))).shape == (6, 0)


def _on_segments(points, boxes, steps=400):
    """``[N]`` bool, sampled: whether some point of the segment from the origin to each point lies in a box."""
    fractions = np.linspace(0.0, 1.0, steps)
    along = (points[:, None, :3] * fractions[None, :, None]).reshape(-1, 3)
    return points_in_boxes(along, boxes).any(1).reshape(len(points), steps).any(1)


def test_ghosts_stand_in_free_space_and_leave_the_ground_truth_cameras_and_other_points_alone(loaded_sample,
                                                                                               database):
    before, after, record = _ghosted(loaded_sample, database)
    boxes = np.array(record['ghost_boxes'])
    assert len(boxes) == 3 and len(record['ghost_names']) == len(record['ghost_sources']) == 3
    scene = before['gt_bboxes_3d'].tensor.numpy()
    assert not bev_overlaps(boxes, scene).any()
    assert bev_overlaps(boxes, boxes).sum() == len(boxes)  # each overlaps only itself
    corners = box_corners(boxes).reshape(-1, 3)
    assert (corners >= RANGE[:3]).all() and (corners <= RANGE[3:]).all()
    assert torch.equal(after['gt_bboxes_3d'].tensor, before['gt_bboxes_3d'].tensor)
    assert after['gt_labels_3d'].tolist() == before['gt_labels_3d'].tolist()
    assert all(np.array_equal(a, b) for a, b in zip(after['img'], before['img']))
    # the scene's points: exactly those off every ghost's shadow, in their order, then the ghosts'
    original = before['points'].tensor.numpy()
    shadow = segments_through_boxes(original, boxes).any(1)
    kept = len(original) - record['num_shadowed_points']
    assert shadow.sum() == record['num_shadowed_points'] > 0
    np.testing.assert_array_equal(after['points'].tensor.numpy()[:kept], original[~shadow])
    assert len(after['points']) == kept + record['num_ghost_points']
    # the shadow, checked by walking along each ray: a sample of the removed and of the kept points
    rng = np.random.default_rng(0)
    removed, stayed = np.flatnonzero(shadow), np.flatnonzero(~shadow)
    assert _on_segments(original[rng.choice(removed, min(300, len(removed)))], boxes).all()
    near = stayed[np.linalg.norm(original[stayed, :2] - boxes[rng.integers(3, size=len(stayed)), :2], axis=1) < 8]
    assert not _on_segments(original[near[:300]], boxes).any()
    # a real shadow: points farther than the whole ghost are gone, not only those inside it
    farthest = np.linalg.norm(box_corners(boxes)[..., :2], axis=-1).max()
    assert (np.linalg.norm(original[removed, :2], axis=1) > farthest).any()


def test_a_ghost_is_a_database_object_turned_to_its_new_box(loaded_sample, database):
    before, after, record = _ghosted(loaded_sample, database, 'lidar_ghost:1', seed=3)
    transform = _corruption('lidar_ghost:1', ghost_database=database, point_cloud_range=RANGE)
    token, index = record['ghost_sources'][0].split(':')
    info = next(info for infos in transform.ghosts.sampler.db_infos.values() for info in infos
                if info['image_idx'] == token and info['gt_idx'] == int(index))
    box, source = np.array(record['ghost_boxes'][0]), np.asarray(info['box3d_lidar'], dtype=np.float64)
    assert record['ghost_names'] == [info['name']]
    angle = box[6] - source[6]
    np.testing.assert_allclose(box[[3, 4, 5]], source[[3, 4, 5]])  # same size, height and range
    assert np.hypot(*box[:2]) == pytest.approx(np.hypot(*source[:2])) and box[2] == pytest.approx(source[2])
    turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    np.testing.assert_allclose(box[:2], turn @ source[:2], atol=1e-6)
    expected = transform.ghosts.sampler.object_points(info).tensor.numpy().astype(np.float64)
    expected[:, :2] = expected[:, :2] @ turn.T
    hidden = segments_through_boxes(expected, before['gt_bboxes_3d'].tensor.numpy()).any(1)
    ghost = after['points'].tensor.numpy()[-record['num_ghost_points']:]
    assert len(ghost) == (~hidden).sum() > 0
    np.testing.assert_allclose(ghost, expected[~hidden], atol=1e-4)  # every column: intensity, sweep time
    assert points_in_boxes(ghost, box[None]).mean() > 0.9


def test_ghosts_are_reproducible_and_need_their_database(loaded_sample, database):
    first = _ghosted(loaded_sample, database, seed=4)[2]
    assert _ghosted(loaded_sample, database, seed=4)[2] == first
    assert _ghosted(loaded_sample, database, seed=5)[2]['ghost_boxes'] != first['ghost_boxes']
    with pytest.raises(ValueError, match='needs ghost_database'):
        _corruption('lidar_ghost:2')
    with pytest.raises(ValueError, match='only for lidar_ghost, mixed_lie'):
        _corruption('fov:90', ghost_database=database)
    cameras_only = _corruption('mixed_lie:120', ghost_database=database, inputs=['img'])  # a camera-only model
    assert cameras_only.ghosts is None and cameras_only.unread_inputs == ('points', )


@pytest.mark.parametrize('camera', sorted(CAMERA_MOUNTS))
def test_the_default_yaw_moves_every_demo_projection_by_two_tokens(camera):
    cfg = Config.fromfile(DEMO_CONFIG)
    final_h, final_w = cfg.ida_aug_conf['final_dim']
    stride = final_h / DEMO_TOKENS[0]
    assert final_w / DEMO_TOKENS[1] == stride
    resize = max(final_h / cfg.ida_aug_conf['H'], final_w / cfg.ida_aug_conf['W'])  # the test-time resize
    focal = CAMERA_MOUNTS[camera].focal_1600 * cfg.ida_aug_conf['W'] / NUSCENES_IMAGE_SIZE[0] * resize
    assert yaw_token_shift(VIEW_YAW_DEG, focal, stride) >= 2
    assert yaw_token_shift(2.0, focal, stride) < 1  # what extrinsic:2 does


def _projected_u(lidar2img, points):
    homogeneous = np.concatenate([points, np.ones((len(points), 1))], 1) @ np.asarray(lidar2img, np.float64).T
    return homogeneous[:, 0] / homogeneous[:, 2]


def test_view_yaw_moves_the_projections_of_its_views_by_the_stated_tokens(loaded_sample):
    before = loaded_sample()
    after = _corruption('view_yaw:2:20', seed=1)(loaded_sample())
    views = after[CORRUPTION_KEY]['yawed_views']
    assert len(views) == 2 == len(set(views))
    assert after[CORRUPTION_KEY]['yawed_views'] == _corruption('view_yaw:2:20', seed=1)(loaded_sample())[
        CORRUPTION_KEY]['yawed_views']
    angles = np.deg2rad(np.linspace(-30, 30, 121))  # directions in each camera's x-z plane, -10 deg included
    stride = 16.0
    for view in range(len(before['img'])):
        clean, yawed = before['lidar2img'][view], after['lidar2img'][view]
        assert np.array_equal(after['img'][view], before['img'][view])
        if view not in views:
            assert np.array_equal(clean, yawed)
            continue
        focal = float(before['cam_intrinsic'][view][0, 0])
        in_camera = np.stack([np.sin(angles), np.full_like(angles, 0.3), np.cos(angles)], 1) * 12.0
        cam2lidar = np.linalg.inv(np.asarray(before['lidar2cam'][view], np.float64))
        in_lidar = in_camera @ cam2lidar[:3, :3].T + cam2lidar[:3, 3]
        tokens = (_projected_u(yawed, in_lidar) - _projected_u(clean, in_lidar)) / stride
        assert tokens.min() == pytest.approx(yaw_token_shift(20.0, focal, stride), rel=1e-6)
        assert tokens[60] == pytest.approx(focal * np.tan(np.deg2rad(20.0)) / stride, rel=1e-6)  # on the axis
    assert torch.equal(after['points'].tensor, before['points'].tensor)
    with pytest.raises(ValueError, match='has 6 camera views'):
        _corruption('view_yaw:7:20')(loaded_sample())


def test_lidar_misalignment_is_multicorrupts():
    # 90 deg: x -> -y (about z), stays (about y), -> +z (about x); then 2 m along x
    np.testing.assert_allclose(lidar_misalignment(90.0, 2.0) @ [1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0],
                               atol=1e-12)
    c, s = np.cos(np.deg2rad(-3.0)), np.sin(np.deg2rad(-3.0))
    rx = np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    ry = np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    rz = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
    point = np.array([10.0, -4.0, -1.5])
    expected = rx @ ry @ rz @ point + [MISALIGNMENT_SHIFT_M, 0, 0]
    points = LiDARPoints(torch.tensor([[*point, 7.0, 0.05]]), points_dim=5)
    boxes = np.array([[10.0, -4.0, -2.0, 4.0, 2.0, 1.5, 0.0]])
    results = _corruption('lidar_misalign:1:3')(dict(points=points, sample_idx='a', ann_info=dict(gt_bboxes_3d=boxes)))
    moved = results['points'].tensor.numpy()
    np.testing.assert_allclose(moved[0, :3], expected, atol=1e-5)
    assert moved[0, 3:].tolist() == pytest.approx([7.0, 0.05]) and results[CORRUPTION_KEY]['misaligned']
    assert np.array_equal(results['ann_info']['gt_bboxes_3d'], boxes)
    unmoved = _corruption('lidar_misalign:0:3')(dict(points=points, sample_idx='a'))
    assert torch.equal(unmoved['points'].tensor, points.tensor) and not unmoved[CORRUPTION_KEY]['misaligned']


@pytest.mark.parametrize('spec, fraction', [('lidar_misalign:0.2:1', 0.2), ('lidar_misalign:0.6:3', 0.6)])
def test_lidar_misalignment_hits_its_fraction_of_the_frames(spec, fraction):
    points = LiDARPoints(torch.ones(2, 5), points_dim=5)
    misaligned = [_corruption(spec, seed=seed)(dict(points=points, sample_idx=f'token-{seed % 7}'))[CORRUPTION_KEY]
                  ['misaligned'] for seed in range(600)]
    assert np.mean(misaligned) == pytest.approx(fraction, abs=0.06)


def test_mixed_lie_puts_ghosts_and_yawed_views_in_opposite_sectors(loaded_sample, database):
    for seed in range(3):
        before = loaded_sample()
        after = _corruption('mixed_lie:120', ghost_database=database, point_cloud_range=RANGE,
                            seed=seed)(loaded_sample())
        record = after[CORRUPTION_KEY]
        assert (record['num_ghosts'], record['yaw_deg']) == (3, VIEW_YAW_DEG)
        lidar_yaw, camera_yaw = record['lidar_sector_deg'], record['camera_sector_deg']
        assert abs((camera_yaw - lidar_yaw) % 360 - 180) < 1e-6
        ghosts = np.array(record['ghost_boxes'])
        assert len(ghosts) >= 1
        azimuths = np.degrees(np.arctan2(ghosts[:, 1], ghosts[:, 0]))
        assert (np.abs((azimuths - lidar_yaw + 180) % 360 - 180) <= 60 + 1e-6).all()
        camera_yaws = np.degrees([camera_forward_yaw(m) for m in before['lidar2cam']])
        facing = np.flatnonzero(np.abs((camera_yaws - camera_yaw + 180) % 360 - 180) <= 60).tolist()
        assert record['yawed_views'] == facing and 'views' not in record  # no view is black
        for view in range(len(before['img'])):
            assert np.array_equal(before['lidar2img'][view], after['lidar2img'][view]) == (view not in facing)
            assert np.array_equal(before['img'][view], after['img'][view])


def test_the_lies_are_registered_for_test_and_training(cmt, database):
    cfg = copy.deepcopy(cmt.cfg)
    cfg.db_sampler = Config(database)
    step = corrupt_config(cfg, 'lidar_ghost:2').data.test.pipeline[3]
    assert step['mode'] == 'lidar_ghost' and step['ghost_database'] == database
    assert step['point_cloud_range'] == list(cfg.point_cloud_range)
    assert 'ghost_database' not in corrupt_config(cfg, 'view_yaw:1:20').data.test.pipeline[3]
    camera_only = [step for step in cmt.test_pipeline() if not step['type'].startswith('LoadPoints')]
    assert insert_corruption(camera_only, 'mixed_lie:120', ghost_database=database)[1]['inputs'] == ['img']
    lies = [dict(spec='lidar_ghost:3', prob=0.2), dict(spec='mixed_lie:120', prob=0.2),
            dict(spec='view_yaw:2:20', prob=0.1), dict(spec='lidar_misalign:0.4:2', prob=0.1)]
    add_train_corruptions(cfg, lies)
    pipeline = cfg.data.train.dataset.pipeline
    train_step = next(step for step in pipeline if step['type'] == 'RandomSensorCorruption')
    assert train_step['ghost_database'] == database
    transform = build_from_cfg(train_step, PIPELINES)
    assert isinstance(transform, RandomSensorCorruption)
    assert [t.ghosts is not None for t in transform.transforms] == [True, True, False, False]
    without_database = Config({key: value for key, value in cfg.items() if key != 'db_sampler'})
    with pytest.raises(ValueError, match='no db_sampler'):
        corrupt_config(without_database, 'mixed_lie:120')


def test_training_ghosts_reach_the_model_where_the_augmented_scene_has_their_points(cmt, database, synthetic_root,
                                                                                     created_data):
    """add_train_corruptions collects the record and the augmentation's keys, so the model finds each ghost's box
    (moved by the random rotation, scaling, translation and flips) around its points."""
    pipeline = cmt.train_pipeline(created_data['dbinfos'], image_drop_prob=0.0, points_drop_prob=0.0)
    collect = next(step for step in pipeline if step['type'] == 'Collect3D')
    collect['meta_keys'] = [key for key in collect['meta_keys'] if key not in AUGMENTATION_META_KEYS]
    cfg = Config(dict(data=dict(train=dict(pipeline=pipeline)), db_sampler=database,
                      point_cloud_range=list(cmt.cfg.point_cloud_range)))
    assert CORRUPTION_KEY not in collect['meta_keys']
    add_train_corruptions(cfg, [dict(spec='lidar_ghost:3', prob=1.0)])
    dataset = cmt.build_dataset(synthetic_root, created_data['val'], cfg.data.train.pipeline, test_mode=False)
    np.random.seed(1)
    sample = dataset[0]
    metas, points = sample['img_metas'].data, sample['points'].data
    assert metas['transformation_3d_flow'][:3] == ['R', 'S', 'T']
    recorded = torch.tensor(metas[CORRUPTION_KEY]['ghost_boxes'])[:, :7]
    moved = ghost_boxes(metas, torch.device('cpu'))
    assert len(moved) == len(recorded) > 0
    assert (count_points_in_boxes(points, moved) > 0).all(), 'every ghost box holds its points'
    assert count_points_in_boxes(points, recorded).sum() < count_points_in_boxes(points, moved).sum()
