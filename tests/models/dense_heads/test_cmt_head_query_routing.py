"""AQR's per-query routing loss in the head and the detector: targets of a constructed sample, the gradient
reaching only the router, the point counts the detector passes."""
import pytest
import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.aqr.routing_targets import (camera_visible_objects, matched_object_targets,
                                                                  query_target_loss)
from projects.mmdet3d_plugin.models.aqr.sensor_lies import near_boxes
from projects.mmdet3d_plugin.models.utils.camera_geometry import stack_lidar2img
from projects.mmdet3d_plugin.models.utils.positional_encoding import denormalize_points
from test_cmt_head import features, head_cfg

AQR = dict(aqr_config=dict(type='AQRWeightGenerator', window_sizes=[3, 3], query_loss_weight=1.0, min_lidar_points=3),
           attention_bias_config=dict(type='AttentionBiasGenerator', window_size=3, bias_scale=2.0))


def _head(**aqr_overrides):
    aqr = dict(AQR, aqr_config=dict(AQR['aqr_config'], **aqr_overrides))
    torch.manual_seed(0)
    return head_cfg(**aqr)


def _constructed_sample(cmt_test_data):
    """Three objects: in front of the +x camera with points (both targets 1), at +x without its points (LiDAR 0),
    at -x in a failed view (camera 0)."""
    boxes = torch.tensor([[6.0, 0.0, -1.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0], [9.0, 3.0, -1.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0],
                          [-7.0, 1.0, -1.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0]])
    boxes = LiDARInstance3DBoxes(boxes, box_dim=9)
    meta = dict(cmt_test_data['make_img_metas'](1)[0], corruption=dict(views=[1]))
    return boxes, torch.tensor([0, 1, 3]), meta, torch.tensor([40, 0, 40])


def test_targets_of_a_constructed_sample_and_gradient_reaching_only_the_router(cmt_test_data):
    head = _head()
    boxes, labels, meta, num_points = _constructed_sample(cmt_test_data)
    bev, img = features(bs=1)
    img.requires_grad_(True)
    bev.requires_grad_(True)
    preds = head.train()([bev], [img], [meta], [boxes], [labels])
    routing = preds.routing
    matched = []
    head.detection_loss([boxes], [labels], preds, matched_objects=matched)
    assert len(matched) == 1 and len(matched[0]) == 2, 'one [Q] matching per task of the sample'
    objects = {int(i) for task in matched[0] for i in task if i >= 0}
    assert objects == {0, 1, 2}, 'every object is matched in its task'
    generator = head.aqr_weight_generator
    losses = generator.query_loss(routing.lidar_weights, routing.camera_weights, matched, [boxes.gravity_center],
                                  [num_points], [meta], routing.geometry)
    # the targets the loss used: recompute them as the constructed truth says
    expected = {0: (1.0, 1.0), 1: (0.0, 1.0), 2: (1.0, 0.0)}
    for task in matched[0]:
        targets, is_matched = matched_object_targets(
            [task], num_points >= generator.min_lidar_points,
            camera_visible_objects(boxes.gravity_center, stack_lidar2img([meta])[0], meta))
        for query in is_matched.nonzero()[:, 0].tolist():
            assert tuple(targets[query].tolist()) == expected[int(task[query])]
    head.zero_grad()
    losses['loss_aqr_query'].backward()
    with_grad = {name for name, p in head.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad and all(name.startswith('aqr_weight_generator.') for name in with_grad), sorted(with_grad)
    assert bev.grad is None and img.grad is None, 'the routing targets must not train the features'
    assert 0.0 <= losses['aqr_query_accuracy'].item() <= 1.0


def test_head_loss_has_the_query_loss_and_asks_for_point_counts(cmt_test_data):
    head = _head()
    assert head.needs_gt_point_counts
    boxes, labels, meta, num_points = _constructed_sample(cmt_test_data)
    bev, img = features(bs=1)
    preds = head.train()([bev], [img], [meta], [boxes], [labels])
    losses = head.loss([boxes], [labels], preds, gt_num_points=[num_points])
    assert {'loss_aqr_query', 'aqr_query_accuracy'} <= set(losses)
    assert torch.isfinite(losses['loss_aqr_query']) and losses['loss_aqr_query'] > 0
    with pytest.raises(ValueError, match='needs gt_num_points'):
        head.loss([boxes], [labels], preds)
    assert not _head(query_loss_weight=0.0).needs_gt_point_counts


def test_detector_counts_points_for_the_query_loss(cmt_test_data):
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    cfg.model.pts_bbox_head.aqr_config.update(query_loss_weight=1.0)
    model = build_model(cfg.model)
    model.init_weights()
    outputs = cmt_test_data['train_step'](model, cmt_test_data['random_batch']((3, 2)))
    assert 'loss_aqr_query' in outputs['log_vars'] and 'aqr_query_accuracy' in outputs['log_vars']
    assert model.pts_bbox_head.aqr_weight_generator.weight_head.weight.grad.abs().sum() > 0


def test_oracle_routing_replaces_the_learned_weights_at_test_time(cmt_test_data):
    """Points only in front, the back view black: queries behind get LiDAR 0 and camera 0."""
    head = _head(query_loss_weight=0.0)
    head.test_cfg = dict(aqr_routing='oracle')
    assert head.needs_points_in_metas
    boxes, labels, meta, _ = _constructed_sample(cmt_test_data)
    bev, img = features(bs=1)
    meta = dict(meta, lidar_points=torch.tensor([[6.0, 0.0, 0.0]]))
    routing = head.eval()([bev], [img], [meta]).routing
    weights = torch.stack([routing.lidar_weights, routing.camera_weights], -1)
    assert set(weights.unique().tolist()) <= {0.0, 1.0}
    info = routing.projection_info
    front = info['pts_pers_idx'][..., 0] == 0
    assert (routing.camera_weights[front & info['visible']] == 1).all()
    assert (routing.camera_weights[~front] == 0).all(), 'the back view is blacked out'
    assert 0 < routing.lidar_weights.sum() < routing.lidar_weights.numel()
    learned = head.train()([bev], [img], [meta], [boxes], [labels]).routing
    assert not set(learned.lidar_weights.unique().tolist()) <= {0.0, 1.0}, 'training always uses the router'
    with pytest.raises(KeyError, match='lidar_points'):
        head.eval()([bev], [img], [_constructed_sample(cmt_test_data)[2]])
    head.test_cfg = dict(aqr_routing='best')
    with pytest.raises(ValueError, match="aqr_routing"):
        head.eval()([bev], [img], [meta])


def test_the_object_oracle_gives_no_lidar_to_queries_over_bare_ground(cmt_test_data):
    head = _head(query_loss_weight=0.0)
    boxes, labels, meta, _ = _constructed_sample(cmt_test_data)
    bev, img = features(bs=1)
    flat = torch.stack(torch.meshgrid(torch.arange(-50.0, 50.0, 2.0), torch.arange(-50.0, 50.0, 2.0),
                                      indexing='xy'), -1).reshape(-1, 2)
    ground = torch.cat([flat, torch.full((len(flat), 1), -1.8)], 1)
    standing = torch.tensor([[6.0, 0.0, -1.0]])
    lidar = {}
    for routing, points in (('oracle', ground), ('oracle_objects', ground),
                            ('oracle_objects', torch.cat([ground, standing]))):
        head.test_cfg = dict(aqr_routing=routing)
        assert head.needs_points_in_metas
        lidar[routing, len(points)] = head.eval()([bev], [img], [dict(meta, lidar_points=points)]).routing.lidar_weights
    assert (lidar['oracle', len(ground)] == 1).all(), 'the plain oracle counts the ground'
    assert (lidar['oracle_objects', len(ground)] == 0).all()
    assert 0 < lidar['oracle_objects', len(ground) + 1].sum() < lidar['oracle', len(ground)].sum()


def test_detector_puts_points_in_the_metas_for_the_oracle(cmt_test_data):
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    cfg.model.test_cfg.pts.aqr_routing = 'oracle'
    model = build_model(cfg.model)
    model.init_weights()
    data = cmt_test_data['random_batch']((2, ))
    model.eval()
    with torch.no_grad():
        results = model.forward(return_loss=False, img_metas=[data['img_metas']], points=[data['points']],
                                img=[data['img']])
    assert len(results) == 1 and 'lidar_points' not in data['img_metas'][0], 'the caller\'s metas unchanged'


#: A ghost (a 1 m x 1 m box, placed at a query's reference point in the test) and the back camera's calibration
#: yawed: the record of a mixed_lie.
GHOST = [0.0, 0.0, -1.5, 1.0, 1.0, 1.5, 0.0, 0.0, 0.0]
LIES = dict(mode='mixed_lie', ghost_boxes=[GHOST], yawed_views=[1])


def _lying_sample(cmt_test_data, ghost=GHOST):
    """The constructed sample's objects, points everywhere (every LiDAR window occupied), the lies of ``LIES``."""
    boxes, labels, meta, num_points = _constructed_sample(cmt_test_data)
    grid = torch.stack(torch.meshgrid(torch.arange(-11.5, 12.0), torch.arange(-11.5, 12.0), indexing='xy'), -1)
    points = torch.cat([grid.reshape(-1, 2), torch.zeros(grid.numel() // 2, 1)], 1)
    return boxes, labels, dict(meta, corruption=dict(LIES, ghost_boxes=[ghost]), lidar_points=points), num_points


def test_unmatched_queries_get_the_input_truth_at_their_reference_point(cmt_test_data):
    """Near the ghost LiDAR 0, in the yawed view camera 0, elsewhere the oracle; the loss covers the unmatched."""
    head = _head(unmatched_loss_weight=0.5, lie_targets=True)
    assert head.needs_points_in_train_metas and not _head().needs_points_in_train_metas
    reference_xyz = denormalize_points(head.reference_points.weight.detach(), head.router.pc_range)
    ghost_box = [*reference_xyz[0, :2].tolist(), *GHOST[2:]]
    boxes, labels, meta, num_points = _lying_sample(cmt_test_data, ghost_box)
    bev, img = features(bs=1)
    preds = head.train()([bev], [img], [meta], [boxes], [labels])
    targets, info = preds.routing.unmatched_targets[0], preds.routing.projection_info
    ghost = near_boxes(reference_xyz, torch.tensor([ghost_box]))
    assert 0 < ghost.sum() < len(ghost), 'the check needs queries near the ghost and away from it'
    assert (targets[ghost, 0] == 0).all() and (targets[~ghost, 0] == 1).all()
    view = info['pts_pers_idx'][0, :, 0]
    front, back = info['visible'][0] & (view == 0), info['visible'][0] & (view == 1)
    assert front.any() and back.any()
    assert (targets[front, 1] == 1).all() and (targets[back | ~info['visible'][0], 1] == 0).all()
    losses = head.loss([boxes], [labels], preds, gt_num_points=[num_points])
    matched = []
    head.detection_loss([boxes], [labels], preds, matched_objects=matched)
    is_matched = torch.zeros(len(targets), dtype=torch.bool)
    for task in matched[0]:
        is_matched |= task >= 0
    expected = query_target_loss(preds.routing.lidar_weights, preds.routing.camera_weights, targets[None],
                                 ~is_matched[None])
    assert losses['loss_aqr_unmatched'].item() == pytest.approx(0.5 * expected.item(), rel=1e-6)
    assert 0.0 <= losses['aqr_unmatched_accuracy'].item() <= 1.0
    without_points = {key: value for key, value in meta.items() if key != 'lidar_points'}
    with pytest.raises(KeyError, match='lidar_points'):
        head.train()([bev], [img], [without_points], [boxes], [labels])


def test_without_lies_the_yawed_view_and_the_ghost_tell_the_truth(cmt_test_data):
    head = _head(unmatched_loss_weight=1.0)
    boxes, labels, meta, _ = _lying_sample(cmt_test_data)
    bev, img = features(bs=1)
    preds = head.train()([bev], [img], [meta], [boxes], [labels])
    targets, info = preds.routing.unmatched_targets[0], preds.routing.projection_info
    assert (targets[:, 0] == 1).all(), 'points everywhere, no lie counted'
    assert torch.equal(targets[:, 1], info['visible'][0].float())


def test_lies_turn_the_matched_targets_too(cmt_test_data):
    """The object at -x is seen only by the yawed back view: camera 0 with lie_targets; a misaligned frame: LiDAR 0."""
    boxes, labels, meta, num_points = _lying_sample(cmt_test_data)
    meta = dict(meta, corruption=dict(LIES, views=[]))
    bev, img = features(bs=1)
    for lies, expected in ((False, {0: (1.0, 1.0), 1: (0.0, 1.0), 2: (1.0, 1.0)}),
                           (True, {0: (1.0, 1.0), 1: (0.0, 1.0), 2: (1.0, 0.0)})):
        head = _head(lie_targets=lies)
        preds = head.train()([bev], [img], [meta], [boxes], [labels])
        _check_matched_targets(head, preds, boxes, labels, meta, num_points, expected)
    misaligned = dict(meta, corruption=dict(mode='lidar_misalign', misaligned=True))
    head = _head(lie_targets=True)
    preds = head.train()([bev], [img], [misaligned], [boxes], [labels])
    _check_matched_targets(head, preds, boxes, labels, misaligned, num_points,
                           {0: (0.0, 1.0), 1: (0.0, 1.0), 2: (0.0, 1.0)})


def _check_matched_targets(head, preds, boxes, labels, meta, num_points, expected):
    """The matched queries' targets in the loss are ``expected[object]``: a loss of exactly these targets."""
    matched = []
    head.detection_loss([boxes], [labels], preds, matched_objects=matched)
    routing = preds.routing
    targets = torch.zeros(routing.lidar_weights.shape[1], 2)
    is_matched = torch.zeros(len(targets), dtype=torch.bool)
    for task in matched[0]:
        for query in (task >= 0).nonzero()[:, 0].tolist():
            targets[query] = torch.tensor(expected[int(task[query])])
            is_matched[query] = True
    losses = head.aqr_weight_generator.query_loss(routing.lidar_weights, routing.camera_weights, matched,
                                                  [boxes.gravity_center], [num_points], [meta], routing.geometry)
    reference = query_target_loss(routing.lidar_weights, routing.camera_weights, targets[None], is_matched[None])
    assert losses['loss_aqr_query'].item() == pytest.approx(reference.item(), rel=1e-6)


def test_the_lie_options_need_a_routing_loss():
    with pytest.raises(ValueError, match='needs query_loss_weight > 0'):
        _head(query_loss_weight=0.0, unmatched_loss_weight=1.0)
    with pytest.raises(ValueError, match=r'needs query_loss_weight > 0 \(per query\) or aux_loss_weight > 0'):
        _head(query_loss_weight=0.0, lie_targets=True)
    assert _head(query_loss_weight=0.0, aux_loss_weight=1.0, lie_targets=True).aqr_weight_generator.lie_targets
    with pytest.raises(ValueError, match='unmatched_loss_weight must be >= 0'):
        _head(unmatched_loss_weight=-1.0)


def test_detector_puts_points_in_the_train_metas_for_the_unmatched_targets(cmt_test_data):
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    cfg.model.pts_bbox_head.aqr_config.update(query_loss_weight=1.0, unmatched_loss_weight=1.0)
    model = build_model(cfg.model)
    model.init_weights()
    outputs = cmt_test_data['train_step'](model, cmt_test_data['random_batch']((3, 2)))
    assert {'loss_aqr_unmatched', 'aqr_unmatched_accuracy'} <= set(outputs['log_vars'])
