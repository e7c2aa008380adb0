"""CMT is deterministic on CPU: the same input gives bit-identical outputs, losses and gradients.

Run-to-run differences on CPU were once blamed on "spconv's accumulation
order"; they were spconv 2.3's CPU scatter-add race (issue 16,
``mmcv_custom/spconv_cpu_scatter.py``). With it replaced, nothing in a forward
pass depends on thread timing.
"""
import numpy as np
import pytest
import torch
from mmcv import Config
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401

DEMO_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny.py'


def _build(cfg):
    torch.manual_seed(0)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


@pytest.fixture(scope='module', params=['demo', 'r50'])
def model(request, cmt_test_data):
    """The demo model (pillars), and the R50 fusion model at a reduced size (spconv's sparse encoder)."""
    if request.param == 'demo':
        return _build(Config.fromfile(DEMO_CONFIG))
    return _build(cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs'))


def test_two_inference_passes_are_bit_identical(model, cmt_test_data):
    torch.manual_seed(1)
    data = cmt_test_data['random_batch'](num_boxes=(4, 3))
    model.eval()
    with torch.no_grad():
        runs = [model.simple_test(data['points'], data['img_metas'], img=data['img']) for _ in range(2)]
    for first, second in zip(*runs):
        boxes = first['pts_bbox']
        assert len(boxes['scores_3d']) > 0
        assert torch.equal(boxes['boxes_3d'].tensor, second['pts_bbox']['boxes_3d'].tensor)
        assert torch.equal(boxes['scores_3d'], second['pts_bbox']['scores_3d'])
        assert torch.equal(boxes['labels_3d'], second['pts_bbox']['labels_3d'])


def test_two_training_passes_give_bit_identical_losses_and_gradients(model, cmt_test_data):
    torch.manual_seed(2)
    data = cmt_test_data['random_batch'](num_boxes=(4, 3))
    runs = []
    for _ in range(2):
        torch.manual_seed(3)  # dropout and DN noise
        np.random.seed(3)  # GridMask (the R50 config)
        outputs = cmt_test_data['train_step'](model, data)
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        runs.append((outputs['log_vars'], grads))
    (logs, grads), (logs_again, grads_again) = runs
    assert logs == logs_again
    assert grads.keys() == grads_again.keys() and any(name.startswith('pts_voxel_encoder') or
                                                      name.startswith('pts_middle_encoder') for name in grads)
    for name, grad in grads.items():
        assert torch.equal(grad, grads_again[name]), name
