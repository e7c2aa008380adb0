"""CmtDetector on bad input: frames without LiDAR points, NaN/inf points, a single voxel in training, a wrong number
of camera images, queries that no camera sees. Correct output or a clear error, never NaN boxes."""
import warnings

import numpy as np
import pytest
import torch
from mmdet3d.core.points import LiDARPoints
from mmdet3d.models import build_model
from torch.nn.modules.batchnorm import _BatchNorm

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.datasets.pipelines.corruption import SensorCorruption
from projects.mmdet3d_plugin.models.dense_heads.query_router import routing_of
from projects.mmdet3d_plugin.models.detectors.cmt import middle_encoder_bev_shape, sparse_encoder_bev_shape


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: spconv's CPU kernels accumulate in a thread-dependent order (one thread makes results
    bitwise stable), and on a busy machine two threads make them many times slower."""
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


def _build(cmt_test_data, name):
    cfg = cmt_test_data['reduced_config'](name)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


@pytest.fixture(scope='module')
def fusion(cmt_test_data):
    return _build(cmt_test_data, 'cmt_voxel0100_r50_800x320_cbgs')


@pytest.fixture(scope='module')
def lidar(cmt_test_data):
    return _build(cmt_test_data, 'cmt_lidar_voxel0075_cbgs')


@pytest.fixture(scope='module')
def aqr(cmt_test_data):
    return _build(cmt_test_data, 'cmt_aqr_voxel0100_r50_800x320_cbgs')


@pytest.fixture
def fresh_lidar(cmt_test_data):
    """A new LiDAR-only model: its one-time warnings have not been given yet."""
    return _build(cmt_test_data, 'cmt_lidar_voxel0075_cbgs').eval()


def _no_points():
    return torch.zeros(0, 5)


def _simple_test(model, data, points):
    model.eval()
    with torch.no_grad():
        return model.simple_test(points, data['img_metas'], img=data.get('img'))


def _assert_finite_boxes(results, num_samples):
    assert len(results) == num_samples
    for result in results:
        boxes, scores = result['pts_bbox']['boxes_3d'].tensor, result['pts_bbox']['scores_3d']
        assert len(boxes) > 0 and torch.isfinite(boxes).all() and torch.isfinite(scores).all()


def _bev(model, points, metas):
    with torch.no_grad():
        return model.extract_pts_feat(points, None, metas)[0]


def test_a_frame_without_points_gets_the_encoder_output_of_no_voxels(lidar, cmt_test_data):
    """Per sample: an empty frame next to a full one changes nothing for either, and matches an all-empty batch."""
    lidar.eval()
    data = cmt_test_data['random_batch']((3, 2), with_camera=False)
    metas, points = data['img_metas'], data['points']
    mixed = _bev(lidar, [points[0], _no_points()], metas)
    alone = _bev(lidar, [points[0]], metas[:1])
    all_empty = _bev(lidar, [_no_points()], metas[:1])  # no voxel in the whole batch: spconv cannot run
    assert torch.equal(mixed[0], alone[0]) and torch.equal(mixed[1], all_empty[0])

    encoded = lidar.encode_voxels(*lidar.voxelize([_no_points(), _no_points()]), batch_size=2)
    reference = lidar.encode_voxels(*lidar.voxelize(points), batch_size=2)
    assert encoded.shape == reference.shape == (2, *sparse_encoder_bev_shape(lidar.pts_middle_encoder))
    assert not encoded.any()


def test_a_pillar_model_without_points_gets_an_empty_bev_map_of_the_right_shape(cmt_test_data):
    """The demo model encodes the LiDAR as pillars (PointPillarsScatter): no points -> zeros of its BEV shape."""
    from mmcv import Config
    from mmdet3d.models import build_model
    cfg = Config.fromfile('configs/demo/cmt_synthetic_tiny.py')
    demo = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg')).eval()
    assert middle_encoder_bev_shape(demo.pts_middle_encoder) == (64, 128, 128)
    data = cmt_test_data['random_batch']((3, 2), with_camera=False)
    with torch.no_grad():
        empty = demo.encode_voxels(*demo.voxelize([_no_points(), _no_points()]), batch_size=2)
        full = demo.encode_voxels(*demo.voxelize(data['points']), batch_size=2)
    assert empty.shape == full.shape == (2, 64, 128, 128) and not empty.any() and full.any()


def test_batches_without_points_give_finite_boxes_and_losses(fusion, cmt_test_data):
    data = cmt_test_data['random_batch']((3, 2))
    far_away = torch.full((5, 5), 100.0)  # outside point_cloud_range: voxelization keeps nothing
    _assert_finite_boxes(_simple_test(fusion, data, [_no_points(), far_away]), 2)
    outputs = cmt_test_data['train_step'](fusion, dict(data, points=[far_away, _no_points()]))
    assert torch.isfinite(outputs['loss']) and outputs['log_vars']['loss_bbox'] > 0
    grads = [p.grad for p in fusion.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def _lose(data, what):
    """Make every sample of ``data`` degenerate in the way ``what`` says."""
    if what == 'no points':
        data['points'] = [_no_points() for _ in data['points']]
    for meta in data['img_metas']:
        if what in ('points', 'image'):
            meta['dropped_modalities'] = [what]
        elif what == 'camera_fail':
            meta['corruption'] = dict(mode='camera_fail', fail_prob=0.4)
    return data


@pytest.mark.parametrize('what, boxes', [('no points', (3, 2)), ('no ground truth', (0, 0)), ('image', (3, 2)),
                                         ('points', (3, 2)), ('camera_fail', (3, 2))])
def test_a_degenerate_training_batch_gives_every_parameter_a_gradient(aqr, cmt_test_data, what, boxes):
    """DistributedDataParallel (without find_unused_parameters) waits for a gradient of every parameter in every
    iteration, so a process whose samples all lost their points (lidar_drop), their boxes or their images must still
    give one to each; the skipped LiDAR encoders get zero gradients."""
    data = _lose(cmt_test_data['random_batch'](boxes), what)
    outputs = cmt_test_data['train_step'](aqr, data)
    assert torch.isfinite(outputs['loss'])
    missing = [name for name, p in aqr.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing
    if what == 'no points':
        encoders = [*aqr.pts_voxel_encoder.parameters(), *aqr.pts_middle_encoder.parameters()]
        assert encoders and all(not p.grad.any() for p in encoders)


def test_lidar_drop_corruption_gives_finite_boxes(fusion, cmt_test_data):
    data = cmt_test_data['random_batch']((3, 2))
    corrupt = SensorCorruption(mode='lidar_drop')
    dropped = [corrupt(dict(points=LiDARPoints(points, points_dim=5)))['points'].tensor for points in data['points']]
    assert [tuple(points.shape) for points in dropped] == [(0, 5), (0, 5)]
    _assert_finite_boxes(_simple_test(fusion, data, dropped), 2)


def test_non_finite_points_are_dropped_with_a_one_time_warning(fresh_lidar, cmt_test_data):
    data = cmt_test_data['random_batch']((3, 2), with_camera=False)
    points = data['points']
    bad_rows = ([3, 10, 11], [5, 7])
    dirty = [points[0].clone(), points[1].clone()]
    dirty[0][bad_rows[0], 1] = float('nan')
    dirty[1][5, 0], dirty[1][7, 4] = float('inf'), -float('inf')
    clean = [np.delete(sample.numpy(), rows, axis=0) for sample, rows in zip(points, bad_rows)]
    with pytest.warns(UserWarning, match=r'dropped 5 LiDAR points with NaN/inf values \(per sample: \[3, 2\]\)'):
        bev = _bev(fresh_lidar, dirty, data['img_metas'])
    assert torch.equal(bev, _bev(fresh_lidar, [torch.from_numpy(sample) for sample in clean], data['img_metas']))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        results = _simple_test(fresh_lidar, data, dirty)
    assert not [warning for warning in caught if 'CmtDetector' in str(warning.message)]  # warned once only
    _assert_finite_boxes(results, 2)


def test_a_single_voxel_trains_with_the_running_batch_norm_statistics(fresh_lidar, cmt_test_data):
    """A LiDAR input zeroed by ModalMask3D is one voxel at the origin; with one sample per GPU it is the batch's only
    voxel, whose batch statistics do not exist: BatchNorm normalises it with its running statistics instead."""
    data = cmt_test_data['random_batch']((3, 2), with_camera=False)
    data['points'] = [torch.rand(4, 5) * 0.01 + 1.0, _no_points()]  # 4 points in one voxel
    assert len(fresh_lidar.voxelize(data['points'])[0]) == 1
    batch_norms = [m for m in fresh_lidar.pts_middle_encoder.modules() if isinstance(m, _BatchNorm)]
    running = [(m.running_mean.clone(), m.running_var.clone()) for m in batch_norms]
    with pytest.warns(UserWarning, match='single non-empty voxel'):
        outputs = cmt_test_data['train_step'](fresh_lidar, data)
    assert torch.isfinite(outputs['loss'])
    assert all(m.training for m in batch_norms)
    for module, (mean, var) in zip(batch_norms, running):
        assert torch.equal(module.running_mean, mean) and torch.equal(module.running_var, var)
    grads = [p.grad for p in fresh_lidar.pts_middle_encoder.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize('flatten', [False, True])
def test_a_wrong_number_of_camera_images_is_a_clear_error(fusion, cmt_test_data, flatten):
    data = cmt_test_data['random_batch']((3, 2))
    for meta in data['img_metas']:
        meta['lidar2img'] = meta['lidar2img'] + [meta['lidar2img'][0]]  # 3 matrices for 2 images
    img = data['img'].flatten(0, 1) if flatten else data['img']
    with pytest.raises(ValueError, match=r"img has 2 camera images per sample .* img_metas\[0\]\['lidar2img'\] has 3"):
        _simple_test(fusion, dict(data, img=img), data['points'])


def _camera_above(height: float, image_hw) -> np.ndarray:
    """lidar2img of a camera ``height`` metres above the LiDAR looking straight up: every point is behind it."""
    lidar2cam = np.eye(4)
    lidar2cam[2, 3] = -height  # camera axes = LiDAR axes (x right, y down, z forward = up)
    intrinsic = np.eye(4)
    intrinsic[:3, :3] = [[40.0, 0.0, image_hw[1] / 2], [0.0, 40.0, image_hw[0] / 2], [0.0, 0.0, 1.0]]
    return intrinsic @ lidar2cam


def test_queries_no_camera_sees_give_finite_boxes(cmt_test_data):
    model = _build(cmt_test_data, 'cmt_aqr_voxel0100_r50_800x320_cbgs').eval()
    data = cmt_test_data['random_batch']((3, 2))
    metas = data['img_metas']
    for meta in metas:
        meta['lidar2img'] = [_camera_above(100.0, cmt_test_data['image_size'])] * cmt_test_data['num_views']
    with torch.no_grad():
        img_feats, pts_feats = model.extract_feat(data['points'], img=data['img'], img_metas=metas)
        outs = model.pts_bbox_head(pts_feats, img_feats, metas)
        bbox_list = model.pts_bbox_head.get_bboxes(outs, metas)
    routing = routing_of(outs)
    assert not routing.projection_info['visible'].any()
    assert torch.isfinite(routing.lidar_weights).all() and torch.isfinite(routing.camera_weights).all()
    for boxes, scores, _ in bbox_list:
        assert len(boxes) > 0 and torch.isfinite(boxes.tensor).all() and torch.isfinite(scores).all()
    outputs = cmt_test_data['train_step'](model, data)
    assert torch.isfinite(outputs['loss'])
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
