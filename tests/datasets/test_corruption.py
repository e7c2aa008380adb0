"""Test-time sensor corruptions: each mode changes exactly what it says, placed right in the fusion test pipeline."""
import copy

import numpy as np
import pytest
import torch
from mmcv.utils import build_from_cfg
from mmdet.datasets.builder import PIPELINES
from mmdet3d.core.points import LiDARPoints
from PIL import Image

from projects.mmdet3d_plugin.datasets.camera_geometry import lidar2cam_from_sensor2lidar
from projects.mmdet3d_plugin.datasets.corruption_config import (SENSOR_FAILURE_CORRUPTIONS, add_train_corruptions,
                                                               corrupt_config, describe_corruptions, insert_corruption)
from projects.mmdet3d_plugin.datasets.box_geometry import points_in_boxes
from projects.mmdet3d_plugin.datasets.corruption_geometry import (axis_angle_rotation, boxes_at_time_lag,
                                                                  camera_forward_yaw, enlarged_boxes, kept_beams,
                                                                  points_in_sweep_frames)
from projects.mmdet3d_plugin.datasets.pipelines.corruption import CORRUPTION_KEY
from projects.mmdet3d_plugin.datasets.pipelines.corruption_spec import parse_corruption

SAMPLE = 0  # val sample 0 of the synthetic set


@pytest.fixture(scope='module')
def run_test_pipeline(synthetic_root, created_data, cmt):
    """Factory: ``(points [N, 5], img [V, 3, H, W], img_metas)`` of a val sample through the fusion test pipeline.

    ``corruption=None`` gives the clean sample (cached); otherwise the
    corruption is inserted with ``insert_corruption(**options)``.
    """
    clean = {}

    def run(corruption=None, index=SAMPLE, **options):
        if corruption is None and index in clean:
            return clean[index]
        pipeline = cmt.test_pipeline()
        if corruption is not None:
            pipeline = insert_corruption(pipeline, corruption, **options)
        data = cmt.build_dataset(synthetic_root, created_data['val'], pipeline, test_mode=True)[index]
        output = data['points'][0].data, data['img'][0].data, data['img_metas'][0].data
        if corruption is None:
            clean[index] = output
        return output

    return run


@pytest.fixture(scope='module')
def clean_rings(synthetic_root, created_data, cmt):
    """``[N]`` ring index of every point of the clean sample, read from the LiDAR files (key frame, then sweeps)."""
    info = cmt.build_dataset(synthetic_root, created_data['val'], [], test_mode=True).get_data_info(SAMPLE)
    files = [info['pts_filename']] + [sweep['data_path'] for sweep in info['sweeps']]
    return np.concatenate([np.fromfile(path, dtype=np.float32).reshape(-1, 5)[:, 4] for path in files])


def _black_after_normalisation(cmt):
    """``[3, 1, 1]`` value of a black pixel after NormalizeMultiviewImage (to_rgb=False in the config)."""
    assert not cmt.IMG_NORM_CFG['to_rgb']
    return torch.tensor([-m / s for m, s in zip(cmt.IMG_NORM_CFG['mean'], cmt.IMG_NORM_CFG['std'])]).view(3, 1, 1)


def _rows(points):
    return {tuple(row) for row in points.tolist()}


@pytest.mark.parametrize('spec, expected', [
    ('lidar_drop', dict(mode='lidar_drop')),
    (' camera_drop ', dict(mode='camera_drop')),
    ('view_drop:2', dict(mode='view_drop', view=2)),
    ('fov:120', dict(mode='fov', fov_deg=120.0)),
    ('beams:16', dict(mode='beams', keep_beams=16)),
    ('points:0.1', dict(mode='points', keep_ratio=0.1)),
    ('object_drop:0.5', dict(mode='object_drop', drop_prob=0.5)),
    ('camera_fail:0', dict(mode='camera_fail', fail_prob=0.0)),
    ('extrinsic:2', dict(mode='extrinsic', rotation_deg=2.0)),
    ('mixed:120', dict(mode='mixed', sector_deg=120.0)),
])
def test_parse_corruption(spec, expected):
    assert parse_corruption(spec) == dict(type='SensorCorruption', **expected)


@pytest.mark.parametrize('spec, message', [
    ('radar_drop', 'unknown corruption mode'), ('', 'must be a string'), ('view_drop', 'needs view'),
    ('view_drop:2.5', 'not a camera view index'), ('view_drop:-1', 'view must be'), ('fov:0', 'fov_deg must be'),
    ('fov:400', 'fov_deg must be'), ('fov:abc', 'not an angle'), ('fov:', 'not an angle'),
    ('beams:0', 'keep_beams must be'), ('points:1.5', 'keep_ratio must be'), ('points:nan', 'keep_ratio must be'),
    ('lidar_drop:3', 'takes no argument'), ('object_drop:1.5', 'drop_prob must be a probability in'),
    ('camera_fail:-0.1', 'fail_prob must be a probability'), ('extrinsic:0', 'rotation_deg must be an angle'),
    ('mixed:200', 'sector_deg must be a sector width in'), ('object_drop', 'needs drop_prob'),
])
def test_parse_errors_name_the_cause(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_corruption(spec)


def test_transform_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"\['keep_beams'\] are not arguments of mode 'fov'"):
        build_from_cfg(dict(type='SensorCorruption', mode='fov', fov_deg=90, keep_beams=4), PIPELINES)
    with pytest.raises(ValueError, match='keep_beams must be a number of beams'):
        build_from_cfg(dict(type='SensorCorruption', mode='beams', keep_beams=float('inf')), PIPELINES)
    with pytest.raises(ValueError, match='cannot keep 64 beams'):
        build_from_cfg(dict(type='SensorCorruption', mode='beams', keep_beams=64), PIPELINES)
    with pytest.raises(KeyError, match='needs results'):
        build_from_cfg(dict(type='SensorCorruption', mode='camera_drop'), PIPELINES)(dict(points=None))


def test_insertion_goes_after_the_loaders_and_before_test_time_augmentation(cmt):
    pipeline = cmt.test_pipeline()
    corrupted = insert_corruption(pipeline, 'beams:8', seed=3)
    types = [step['type'] for step in corrupted]
    assert types == ['LoadPointsFromFile', 'LoadPointsFromMultiSweeps', 'LoadMultiViewImageFromFiles',
                     'SensorCorruption', 'MultiScaleFlipAug3D']
    assert corrupted[3] == dict(type='SensorCorruption', mode='beams', keep_beams=8, seed=3, sweep_time_column=4)
    assert insert_corruption(pipeline, 'object_drop:0.5')[3]['sweep_time_column'] == 4
    assert 'sweep_time_column' not in insert_corruption(pipeline, 'points:0.5')[3]
    collect = corrupted[4]['transforms'][-1]
    assert collect['type'] == 'Collect3D' and CORRUPTION_KEY in collect['meta_keys']
    assert pipeline == cmt.test_pipeline()  # the input is not modified


def test_insertion_refuses_pipelines_it_cannot_corrupt(cmt):
    pipeline = cmt.test_pipeline()
    # a loader inside MultiScaleFlipAug3D: the model reads the input, but the corruption cannot come after it
    for loader, corruption in (('LoadMultiViewImageFromFiles', 'view_drop:1'), ('LoadPointsFromFile', 'points:0.5')):
        nested = [step for step in pipeline if not step['type'].startswith(loader[:10])]
        nested[-1] = dict(nested[-1], transforms=[dict(type=loader)] + nested[-1]['transforms'])
        with pytest.raises(ValueError, match=f'no top-level {loader}'):
            insert_corruption(nested, corruption)
    normalised_early = pipeline[:2] + [dict(type='NormalizeMultiviewImage', **cmt.IMG_NORM_CFG)] + pipeline[2:]
    with pytest.raises(ValueError, match=r"\(\['NormalizeMultiviewImage'\]\) before its last loading step"):
        insert_corruption(normalised_early, 'camera_drop')
    with pytest.raises(ValueError, match='already holds a SensorCorruption'):
        insert_corruption(insert_corruption(pipeline, 'camera_drop'), 'lidar_drop')
    no_time = copy.deepcopy(pipeline)
    no_time[1]['use_dim'] = [0, 1, 2, 3]
    with pytest.raises(ValueError, match='drops the sweep time'):
        insert_corruption(no_time, 'beams:16')
    with pytest.raises(ValueError, match='unknown corruption mode'):
        insert_corruption(pipeline, 'snow')


def test_a_model_that_reads_no_points_keeps_them_out_of_the_corruption(cmt):
    """A camera-only pipeline loads no points at any level: lidar_drop corrupts nothing of it, mixed only its
    cameras (the LiDAR part is recorded as unread)."""
    camera_only = [step for step in cmt.test_pipeline() if not step['type'].startswith('LoadPoints')]
    assert insert_corruption(camera_only, 'lidar_drop')[1] == dict(type='SensorCorruption', mode='lidar_drop',
                                                                   inputs=[])
    mixed = build_from_cfg(insert_corruption(camera_only, 'mixed:120')[1], PIPELINES)
    assert (mixed.input_keys, mixed.unread_inputs) == (('img', ), ('points', ))
    images = [np.full((4, 6, 3), 50, dtype=np.uint8) for _ in range(6)]
    lidar_drop = build_from_cfg(insert_corruption(camera_only, 'lidar_drop')[1], PIPELINES)
    results = lidar_drop(dict(img=images))
    assert results[CORRUPTION_KEY] == dict(name='lidar_drop', mode='lidar_drop', unread_inputs=['points'])
    assert results['img'] is images and 'points' not in results
    with pytest.raises(ValueError, match="corrupts \\['points'\\], not \\['img'\\]"):
        build_from_cfg(dict(type='SensorCorruption', mode='fov', fov_deg=90.0, inputs=['img']), PIPELINES)


def test_corrupt_config_rewrites_the_val_and_test_pipelines_of_a_copy(cmt):
    cfg = cmt.cfg
    corrupted = corrupt_config(cfg, 'camera_drop')
    for split in ('val', 'test'):
        assert [step['type'] for step in corrupted.data[split].pipeline][3] == 'SensorCorruption'
        assert 'SensorCorruption' not in [step['type'] for step in cfg.data[split].pipeline]
    assert 'SensorCorruption' not in [step['type'] for step in corrupted.data.train.dataset.pipeline]


def test_train_corruptions_go_before_the_modality_drop_of_a_wrapped_training_set(cmt):
    cfg = copy.deepcopy(cmt.cfg)  # CBGSDataset around the nuScenes set
    add_train_corruptions(cfg, SENSOR_FAILURE_CORRUPTIONS)
    pipeline = cfg.data.train.dataset.pipeline
    types = [step['type'] for step in pipeline]
    assert types[types.index('UnifiedObjectSample') + 1:types.index('ModalMask3D') + 1] == [
        'RandomSensorCorruption', 'ModalMask3D']
    step = pipeline[types.index('RandomSensorCorruption')]
    assert step['corruptions'] == [dict(item) for item in SENSOR_FAILURE_CORRUPTIONS]
    assert step['sweep_time_column'] == 4
    assert 'RandomSensorCorruption' not in [step['type'] for step in cmt.cfg.data.train.dataset.pipeline]
    assert describe_corruptions(SENSOR_FAILURE_CORRUPTIONS) == ('object_drop:0.5 0.15, camera_fail:0.4 0.15, '
                                                                'mixed:120 0.15, camera_drop 0.15')


def test_lidar_drop_leaves_no_point_and_the_pipeline_runs_through(run_test_pipeline):
    clean_points, clean_img, _ = run_test_pipeline()
    points, img, metas = run_test_pipeline('lidar_drop')
    assert points.shape == (0, clean_points.shape[1]) and points.dtype == clean_points.dtype
    assert torch.equal(img, clean_img)
    assert metas[CORRUPTION_KEY] == dict(name='lidar_drop', mode='lidar_drop', num_points_before=len(clean_points),
                                         num_points_after=0)


def test_camera_drop_makes_every_pixel_black_before_normalisation(run_test_pipeline, cmt):
    clean_points, clean_img, _ = run_test_pipeline()
    points, img, metas = run_test_pipeline('camera_drop')
    black = _black_after_normalisation(cmt).expand_as(img[0])
    assert all(torch.allclose(view, black) for view in img)
    assert not any(torch.allclose(view, black) for view in clean_img)
    assert torch.equal(points, clean_points)
    assert metas[CORRUPTION_KEY]['views'] == list(range(len(img)))


@pytest.mark.parametrize('view', [0, 4])
def test_view_drop_blacks_out_that_view_only(run_test_pipeline, cmt, view):
    clean_points, clean_img, clean_metas = run_test_pipeline()
    points, img, metas = run_test_pipeline(f'view_drop:{view}')
    black = _black_after_normalisation(cmt).expand_as(img[0])
    assert torch.allclose(img[view], black) and not torch.allclose(clean_img[view], black)
    others = [v for v in range(len(img)) if v != view]
    assert torch.equal(img[others], clean_img[others]) and torch.equal(points, clean_points)
    names = ['CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT', 'CAM_BACK_RIGHT']
    assert metas[CORRUPTION_KEY]['camera'] == names[view] == clean_metas['filename'][view].split('/')[-2]


def test_view_drop_of_a_missing_view_is_a_clear_error(run_test_pipeline):
    with pytest.raises(ValueError, match=r'has 6 camera views \(0..5\)'):
        run_test_pipeline('view_drop:6')


def test_fov_keeps_exactly_the_points_in_the_forward_wedge(run_test_pipeline):
    clean_points, clean_img, _ = run_test_pipeline()
    points, img, metas = run_test_pipeline('fov:120')
    # The synthetic rig is nuScenes': CAM_FRONT looks along LiDAR +y.
    assert metas[CORRUPTION_KEY]['forward_yaw_deg'] == pytest.approx(90.0, abs=1e-6)
    azimuth = torch.rad2deg(torch.atan2(clean_points[:, 1], clean_points[:, 0]))
    inside = (azimuth >= 30.0) & (azimuth <= 150.0)
    assert torch.equal(points, clean_points[inside])
    assert 0.2 < len(points) / len(clean_points) < 0.5
    assert torch.equal(img, clean_img)


def test_forward_direction_follows_the_front_camera_of_any_rig():
    """A level camera turned to look along yaw 135 deg in the LiDAR frame."""
    yaw = np.deg2rad(135.0)
    forward = [np.cos(yaw), np.sin(yaw), 0.0]
    cam_axes_in_lidar = np.array([[np.sin(yaw), -np.cos(yaw), 0.0], [0.0, 0.0, -1.0], forward]).T  # cam x, y, z
    lidar2cam = lidar2cam_from_sensor2lidar(cam_axes_in_lidar, [0.5, 0.0, 1.0])
    assert np.degrees(camera_forward_yaw(lidar2cam)) == pytest.approx(135.0)
    points = LiDARPoints(torch.tensor([[-10.0, 9.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0], [0.0, 10.0, 0.0, 0.0]]),
                         points_dim=4)
    fov = build_from_cfg(dict(type='SensorCorruption', mode='fov', fov_deg=60), PIPELINES)
    kept = fov(dict(points=points, camera_names=['CAM_FRONT'], lidar2cam=[lidar2cam]))['points']
    assert kept.tensor[:, 0].tolist() == [-10.0]
    with pytest.raises(KeyError, match='give forward_yaw_deg'):
        fov(dict(points=points))
    by_yaw = build_from_cfg(dict(type='SensorCorruption', mode='fov', fov_deg=60, forward_yaw_deg=0), PIPELINES)
    assert by_yaw(dict(points=points))['points'].tensor[:, 0].tolist() == [10.0]


def test_beams_keeps_the_points_of_the_chosen_rings(run_test_pipeline, clean_rings):
    """Checked against the ring index the LiDAR files store (the loaders overwrite it with the sweep time)."""
    clean_points, _, _ = run_test_pipeline()
    points, _, metas = run_test_pipeline('beams:8')
    kept = kept_beams(32, 8)
    assert metas[CORRUPTION_KEY]['kept_beams'] == kept.tolist() == [0, 4, 8, 12, 16, 20, 24, 28]
    assert len(clean_rings) == len(clean_points) and len(np.unique(clean_rings[clean_points[:, 4] > 0])) > 8
    remaining = _rows(points)
    actually_kept = np.array([row in remaining for row in map(tuple, clean_points.tolist())])
    expected = np.isin(clean_rings, kept)
    assert len(remaining) == len(points)
    assert np.mean(actually_kept != expected) < 1e-3
    assert set(np.unique(clean_rings[actually_kept]).tolist()) == set(kept.tolist())
    assert 0.15 < len(points) / len(clean_points) < 0.4


def test_points_in_sweep_frames_undoes_the_sweep_loader():
    rng = np.random.default_rng(0)
    angle = 0.3
    rotation = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    sweep = dict(sensor2lidar_rotation=rotation, sensor2lidar_translation=np.array([-2.0, 0.5, 0.1]),
                 timestamp=9_950_000)
    measured = rng.normal(size=(5, 3)) * 10
    key_frame = rng.normal(size=(3, 3)) * 10
    in_key_frame = np.concatenate([key_frame, measured @ rotation.T + sweep['sensor2lidar_translation']])
    lags = np.array([0, 0, 0, 0.05, 0.05, 0.05, 0.05, 0.05], dtype=np.float32)
    back = points_in_sweep_frames(in_key_frame, lags, [sweep], timestamp=10.0)
    assert np.allclose(back, np.concatenate([key_frame, measured]))
    with pytest.raises(ValueError, match='matches none'):
        points_in_sweep_frames(in_key_frame, lags + np.float32(0.02), [sweep], timestamp=10.0)


def test_points_keeps_a_reproducible_random_fraction(run_test_pipeline):
    clean_points, _, _ = run_test_pipeline()
    points, _, metas = run_test_pipeline('points:0.25', seed=7)
    assert len(points) == round(0.25 * len(clean_points)) == metas[CORRUPTION_KEY]['num_points_after']
    assert _rows(points) <= _rows(clean_points)
    again, _, _ = run_test_pipeline('points:0.25', seed=7)
    other_seed, _, _ = run_test_pipeline('points:0.25', seed=8)
    assert torch.equal(points, again) and not torch.equal(points, other_seed)
    for lag in clean_points[:, 4].unique():  # drawn uniformly: about a quarter of the key frame and of each sweep
        assert (points[:, 4] == lag).sum() / (clean_points[:, 4] == lag).sum() == pytest.approx(0.25, abs=0.03)


def test_points_seed_depends_on_the_sample_token_not_on_the_loading_order():
    points = LiDARPoints(torch.arange(400, dtype=torch.float32).reshape(100, 4), points_dim=4)
    corruption = build_from_cfg(dict(type='SensorCorruption', mode='points', keep_ratio=0.5, seed=1), PIPELINES)

    def draw(token):
        return corruption(dict(points=points, sample_idx=token))['points'].tensor

    first_a = draw('token-a')
    draw('token-b')
    assert torch.equal(draw('token-a'), first_a) and not torch.equal(draw('token-b'), first_a)
    with pytest.raises(KeyError, match='sample_idx'):
        corruption(dict(points=points))


def _ground_truth_boxes(synthetic_root, created_data, cmt, index=SAMPLE):
    dataset = cmt.build_dataset(synthetic_root, created_data['val'], [], test_mode=True)
    return dataset.get_data_info(index)['ann_info']['gt_bboxes_3d'].tensor.numpy()


@pytest.mark.parametrize('probability', [0.0, 0.5, 1.0])
def test_object_drop_removes_the_points_of_the_drawn_objects_only(run_test_pipeline, synthetic_root, created_data,
                                                                  cmt, probability):
    clean_points, clean_img, _ = run_test_pipeline()
    points, img, metas = run_test_pipeline(f'object_drop:{probability}', seed=5)
    record = metas[CORRUPTION_KEY]
    boxes = _ground_truth_boxes(synthetic_root, created_data, cmt)
    assert record['num_objects'] == len(boxes) > 3
    dropped = record['dropped_objects']
    assert len(dropped) == {0.0: 0, 1.0: len(boxes)}.get(probability, len(dropped))
    if probability == 0.5:
        assert 0 < len(dropped) < len(boxes)
    inside = _in_boxes_at_their_time(clean_points.numpy(), enlarged_boxes(boxes[dropped], 0.25))
    assert torch.equal(points, clean_points[torch.from_numpy(~inside)])
    if dropped:  # the drawn objects had points, and none is left inside their (unenlarged) boxes at its time
        assert inside.sum() > 0
        assert not _in_boxes_at_their_time(points.numpy(), boxes[dropped]).any()
    if probability == 1.0:  # objects move: boxes that stay put in the sweeps would keep some of their points
        assert (points_in_boxes(clean_points[:, :3].numpy(), enlarged_boxes(boxes, 0.25)).any(1) != inside).any()
    assert torch.equal(img, clean_img)


def _in_boxes_at_their_time(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """``[N]`` bool: the points ``[N, 5]`` (sweep time lag last) inside a box moved to where it was at their time."""
    inside = np.zeros(len(points), dtype=bool)
    for time_lag in np.unique(points[:, 4]):
        selected = points[:, 4] == time_lag
        inside[selected] = points_in_boxes(points[selected, :3], boxes_at_time_lag(boxes, time_lag)).any(1)
    return inside


def test_object_drop_needs_the_ground_truth_boxes():
    points = LiDARPoints(torch.zeros(3, 4), points_dim=4)
    corruption = build_from_cfg(dict(type='SensorCorruption', mode='object_drop', drop_prob=0.5), PIPELINES)
    with pytest.raises(KeyError, match='needs the ground-truth boxes at test time'):
        corruption(dict(points=points, sample_idx='a'))
    boxes = np.array([[5.0, 0.0, -1.0, 4.0, 2.0, 1.5, 0.3]])
    grown = enlarged_boxes(boxes, 0.25)
    assert np.allclose(grown, [[5.0, 0.0, -1.25, 4.5, 2.5, 2.0, 0.3]]) and np.allclose(boxes[0, 2], -1.0)
    with pytest.raises(ValueError, match='object_margin must be >= 0'):
        build_from_cfg(dict(type='SensorCorruption', mode='object_drop', drop_prob=0.5, object_margin=-1), PIPELINES)


def test_object_drop_tests_each_sweep_against_the_boxes_at_its_time():
    """A box moving at 10 m/s along x: a sweep 0.3 s old saw it 3 m further back."""
    box = np.array([[10.0, 0.0, 0.0, 4.0, 2.0, 1.5, 0.0, 10.0, 0.0]])
    rows = [[10.0, 0.0, 0.5, 0.0],  # key frame, in the box: dropped
            [7.0, 0.0, 0.5, 0.0],  # key frame, behind the box: kept
            [7.0, 0.0, 0.5, 0.3],  # sweep 0.3 s old, in the box as it was then: dropped
            [10.0, 0.0, 0.5, 0.3],  # sweep 0.3 s old, where the box is now but was not then: kept
            [30.0, 0.0, 0.5, 0.3]]  # far away: kept
    points = LiDARPoints(torch.tensor(rows), points_dim=4)
    results = dict(points=points, sample_idx='a', ann_info=dict(gt_bboxes_3d=box))

    def kept(**options):
        corruption = build_from_cfg(dict(type='SensorCorruption', mode='object_drop', drop_prob=1.0, **options),
                                    PIPELINES)
        return corruption(dict(results))['points'].tensor[:, :2].tolist()

    assert kept(sweep_time_column=3) == [[7.0, 0.0], [10.0, 0.0], [30.0, 0.0]]
    assert kept() == [[7.0, 0.0], [7.0, 0.0], [30.0, 0.0]]  # without the time, every point against today's box
    assert kept(sweep_time_column=3, object_margin=1.5) == [[30.0, 0.0]]  # 1.5 m margin: the boxes reach 7 and 10
    static = box.copy()
    static[0, 7] = np.nan  # an unknown velocity counts as standing still
    results['ann_info'] = dict(gt_bboxes_3d=static)
    assert kept(sweep_time_column=3) == [[7.0, 0.0], [7.0, 0.0], [30.0, 0.0]]


def test_camera_fail_blacks_out_a_random_reproducible_set_of_views(run_test_pipeline, cmt):
    clean_points, clean_img, _ = run_test_pipeline()
    black = _black_after_normalisation(cmt).expand_as(clean_img[0])
    seen = set()
    for seed in range(4):
        points, img, metas = run_test_pipeline('camera_fail:0.5', seed=seed)
        views = metas[CORRUPTION_KEY]['views']
        seen.add(tuple(views))
        for view in range(len(img)):
            assert torch.allclose(img[view], black) == (view in views)
            if view not in views:
                assert torch.equal(img[view], clean_img[view])
        assert torch.equal(points, clean_points)
        assert run_test_pipeline('camera_fail:0.5', seed=seed)[2][CORRUPTION_KEY]['views'] == views
    assert len(seen) > 1
    assert run_test_pipeline('camera_fail:0')[2][CORRUPTION_KEY]['views'] == []
    assert run_test_pipeline('camera_fail:1')[2][CORRUPTION_KEY]['views'] == list(range(len(clean_img)))


def _rotation_angle_deg(rotation: np.ndarray) -> float:
    return float(np.degrees(np.arccos(np.clip((np.trace(rotation) - 1) / 2, -1, 1))))


def test_axis_angle_rotation():
    rotation = axis_angle_rotation(np.array([0.0, 0.0, 2.0]), 90.0)
    assert np.allclose(rotation @ [1.0, 0.0, 0.0], [0.0, 1.0, 0.0])
    tilted = axis_angle_rotation(np.array([1.0, 2.0, -0.5]), 3.0)
    assert np.allclose(tilted @ tilted.T, np.eye(3)) and _rotation_angle_deg(tilted) == pytest.approx(3.0)


@pytest.mark.parametrize('degrees', [1, 3])
def test_extrinsic_rotates_every_camera_by_the_angle_and_keeps_the_images(run_test_pipeline, degrees):
    clean_points, clean_img, clean_metas = run_test_pipeline()
    points, img, metas = run_test_pipeline(f'extrinsic:{degrees}', seed=2)
    assert torch.equal(img, clean_img) and torch.equal(points, clean_points)
    axes = metas[CORRUPTION_KEY]['rotation_axes']
    assert len(axes) == len(img) and len({tuple(np.round(a, 6)) for a in axes}) == len(img)
    for clean, moved in zip(clean_metas['lidar2img'], metas['lidar2img']):
        # clean = A @ lidar2cam, moved = A @ R @ lidar2cam (A: intrinsics and image resizing): the change in the
        # LiDAR frame is lidar2cam^-1 @ R @ lidar2cam, a rigid motion whose rotation turns by exactly the angle
        change = np.linalg.inv(np.asarray(clean, dtype=np.float64)) @ np.asarray(moved, dtype=np.float64)
        assert np.allclose(change[3], [0, 0, 0, 1], atol=1e-9)
        assert np.allclose(change[:3, :3] @ change[:3, :3].T, np.eye(3), atol=1e-6)
        assert _rotation_angle_deg(change[:3, :3]) == pytest.approx(degrees, abs=1e-3)


def test_mixed_loses_one_lidar_sector_and_the_cameras_of_the_opposite_one(run_test_pipeline, cmt, synthetic_root,
                                                                          created_data):
    clean_points, clean_img, _ = run_test_pipeline()
    points, img, metas = run_test_pipeline('mixed:120', seed=1)
    record = metas[CORRUPTION_KEY]
    lidar_yaw, camera_yaw = record['lidar_sector_deg'], record['camera_sector_deg']
    assert abs((camera_yaw - lidar_yaw) % 360 - 180) < 1e-6
    azimuth = np.degrees(np.arctan2(clean_points[:, 1].numpy(), clean_points[:, 0].numpy()))
    in_lidar_sector = np.abs((azimuth - lidar_yaw + 180) % 360 - 180) <= 60
    assert torch.equal(points, clean_points[torch.from_numpy(~in_lidar_sector)])
    assert 0.15 < in_lidar_sector.mean() < 0.55
    dataset = cmt.build_dataset(synthetic_root, created_data['val'], [], test_mode=True)
    info = dataset.get_data_info(SAMPLE)
    camera_yaws = [np.degrees(camera_forward_yaw(m)) for m in info['lidar2cam']]
    facing = [view for view, yaw in enumerate(camera_yaws) if abs((yaw - camera_yaw + 180) % 360 - 180) <= 60]
    assert record['views'] == facing and 1 <= len(facing) <= 3
    for view in facing:  # all a black camera saw is outside the LiDAR sector: every direction keeps a modality
        half_fov = np.degrees(np.arctan(Image.open(info['img_filename'][view]).width / 2
                                        / info['cam_intrinsic'][view][0, 0]))
        assert abs((camera_yaws[view] - lidar_yaw + 180) % 360 - 180) > 60 + half_fov > 90
    black = _black_after_normalisation(cmt).expand_as(img[0])
    for view in range(len(img)):
        assert torch.allclose(img[view], black) == (view in facing)
    assert run_test_pipeline('mixed:120', seed=1)[2][CORRUPTION_KEY] == record
