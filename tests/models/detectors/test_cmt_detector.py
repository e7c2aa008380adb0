"""Each of the four CMT configs, at reduced input size: one training step and one simple_test on CPU."""
import pytest
import torch
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401

CONFIGS = {
    'cmt_voxel0075_vov_1600x640_cbgs': dict(with_lidar=True, with_camera=True),
    'cmt_voxel0100_r50_800x320_cbgs': dict(with_lidar=True, with_camera=True),
    'cmt_lidar_voxel0075_cbgs': dict(with_lidar=True, with_camera=False),
    'cmt_camera_vov_1600x640_cbgs': dict(with_lidar=False, with_camera=True),
}


@pytest.fixture(scope='module', params=sorted(CONFIGS))
def built(request, cmt_test_data):
    """(config name, model) built once per config for this module."""
    cfg = cmt_test_data['reduced_config'](request.param)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return request.param, model


def test_training_step_and_simple_test(built, cmt_test_data):
    name, model = built
    modality = CONFIGS[name]
    data = cmt_test_data['random_batch']((3, 2), **modality)
    outputs = cmt_test_data['train_step'](model, data)

    assert torch.isfinite(outputs['loss'])
    log_vars = outputs['log_vars']
    for key in ('loss_cls', 'loss_bbox', 'dn_loss_cls', 'dn_loss_bbox', 'd0.loss_cls', 'd4.dn_loss_bbox'):
        assert key in log_vars, f'{key} missing from {sorted(log_vars)}'
    assert log_vars['loss_cls'] > 0 and log_vars['loss_bbox'] > 0 and log_vars['dn_loss_bbox'] > 0
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f'parameters without gradient: {no_grad[:10]}'
    bad_grad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad_grad, f'non-finite gradients: {bad_grad[:10]}'
    assert model.pts_bbox_head.reference_points.weight.grad.abs().sum() > 0

    model.eval()
    with torch.no_grad():
        results = model.forward(return_loss=False, img_metas=[data['img_metas']],
                                points=[data['points']] if 'points' in data else None,
                                img=[data['img']] if 'img' in data else None)
    assert len(results) == 2
    max_num = model.pts_bbox_head.bbox_coder.max_num
    for result in results:
        boxes, scores, labels = (result['pts_bbox'][k] for k in ('boxes_3d', 'scores_3d', 'labels_3d'))
        assert 0 < len(boxes) <= max_num
        assert boxes.tensor.shape == (len(scores), 9)
        assert torch.isfinite(boxes.tensor).all()
        assert torch.all(scores[:-1] >= scores[1:]) and torch.all((scores >= 0) & (scores <= 1))
        assert labels.min() >= 0 and labels.max() < 10
        assert (boxes.gravity_center[:, :2].abs() <= 61.2).all()


@pytest.fixture(scope='module')
def fusion_r50(cmt_test_data):
    cfg = cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs')
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


def test_samples_without_ground_truth_train_without_nan(fusion_r50, cmt_test_data):
    """A sample with no box next to one with boxes, then a batch with none: finite losses and gradients."""
    for num_boxes in ((2, 0), (0, 0)):
        outputs = cmt_test_data['train_step'](fusion_r50, cmt_test_data['random_batch'](num_boxes))
        assert torch.isfinite(outputs['loss']), num_boxes
        assert all(torch.isfinite(torch.tensor(v)) for v in outputs['log_vars'].values()), outputs['log_vars']
        grads = [p.grad for p in fusion_r50.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g).all() for g in grads)
    assert outputs['log_vars']['loss_bbox'] == 0 and outputs['log_vars']['dn_loss_cls'] == 0
    assert outputs['log_vars']['loss_cls'] > 0  # every query is trained towards background


def test_samples_without_lidar_points(fusion_r50, cmt_test_data):
    """One sample without points trains (more bad LiDAR input: test_cmt_bad_input.py)."""
    data = cmt_test_data['random_batch']((2, 1))
    data['points'][1] = data['points'][1][:0]
    outputs = cmt_test_data['train_step'](fusion_r50, data)
    assert torch.isfinite(outputs['loss'])
