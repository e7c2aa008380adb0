"""AQR's per-query routing loss in the head and the detector: targets of a constructed sample, the gradient
reaching only the router, the point counts the detector passes."""
import pytest
import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.aqr.routing_targets import camera_visible_objects, matched_object_targets
from projects.mmdet3d_plugin.models.utils.camera_geometry import stack_lidar2img
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
