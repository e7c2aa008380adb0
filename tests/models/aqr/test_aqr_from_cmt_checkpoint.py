"""A CMT checkpoint loaded into CMT-AQR: only AQR's parameters missing, and before any step CMT's boxes and scores.

Step 0 of "CMT-AQR from a trained CMT" for the R50 and the VoV configs (reduced, tests/models/conftest.py): one
CMT checkpoint (mmcv's layout, as training writes it) loaded into CMT and into CMT-AQR gives every query the same
scores (within 1e-5) and boxes (within 1e-4 m; the biased attention kernel rounds differently from the plain
one); after one optimiser step the router has moved. Bad input: a missing file and a checkpoint of another
config are refused with the file and the mismatched tensors named.
"""
import logging

import pytest
import torch
from mmcv.runner import build_optimizer, save_checkpoint
from mmdet3d.models import build_model

from projects.mmdet3d_plugin.apis.checkpoint_loading import load_detector_checkpoint, routing_parameter_prefixes
from projects.mmdet3d_plugin.core.bbox.util import denormalize_bbox

BOX_FIELDS = ('center', 'height', 'dim', 'rot', 'vel')
PAIRS = dict(r50=('cmt_voxel0100_r50_800x320_cbgs', 'cmt_aqr_voxel0100_r50_800x320_cbgs'),
             vov=('cmt_voxel0075_vov_1600x640_cbgs', 'cmt_aqr_voxel0075_vov_1600x640_cbgs'))
AQR_PREFIXES = ['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator']


def _model(cmt_test_data, name: str, seed: int):
    torch.manual_seed(seed)
    cfg = cmt_test_data['reduced_config'](name, weight_head_std=0.0)  # the configs' own start
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


@pytest.fixture(scope='module', params=sorted(PAIRS))
def cmt_checkpoint(request, tmp_path_factory, cmt_test_data):
    """``(pair name, path)``: a randomly initialised CMT saved as training saves it (meta, state_dict, optimizer)."""
    cmt = _model(cmt_test_data, PAIRS[request.param][0], seed=0)
    path = str(tmp_path_factory.mktemp('cmt_checkpoint') / f'{request.param}.pth')
    optimizer = build_optimizer(cmt, dict(type='AdamW', lr=1e-4))
    save_checkpoint(cmt, path, optimizer=optimizer, meta=dict(epoch=20, iter=100))
    return request.param, path


def _predictions(model, data):
    """Every query's scores ``[Q, classes]`` and boxes ``[Q, 9]`` (metres, radians) of the last decoder layer."""
    model.eval()
    with torch.no_grad():
        img_feats, pts_feats = model.extract_feat(data['points'], img=data['img'], img_metas=data['img_metas'])
        outs = model.pts_bbox_head(pts_feats, img_feats, data['img_metas'])
    pc_range = model.pts_bbox_head.bbox_coder.pc_range
    scores = torch.cat([task[0]['cls_logits'][-1].sigmoid() for task in outs], -1)
    boxes = [denormalize_bbox(torch.cat([task[0][key][-1] for key in BOX_FIELDS], -1), pc_range) for task in outs]
    return scores, torch.stack(boxes)


def test_cmt_aqr_from_a_cmt_checkpoint_predicts_cmt_boxes_and_scores(cmt_checkpoint, cmt_test_data, caplog):
    pair, path = cmt_checkpoint
    cmt_name, aqr_name = PAIRS[pair]
    cmt, aqr = _model(cmt_test_data, cmt_name, seed=1), _model(cmt_test_data, aqr_name, seed=2)
    assert routing_parameter_prefixes(aqr) == AQR_PREFIXES and routing_parameter_prefixes(cmt) == []
    load_detector_checkpoint(cmt, path)
    with caplog.at_level(logging.INFO):
        load_detector_checkpoint(aqr, path, logger=logging.getLogger('test_step0'), purpose='load_from')
    messages = [record.getMessage() for record in caplog.records if record.name == 'test_step0']
    num_aqr = sum(1 for key in aqr.state_dict() if key.startswith(tuple(p + '.' for p in AQR_PREFIXES)))
    assert len(messages) == 1 and messages[0].startswith(
        f'load_from {path}: {num_aqr} AQR parameters are not in the checkpoint (a CMT checkpoint) and keep their '
        f'initialisation: pts_bbox_head.aqr_weight_generator (')
    torch.manual_seed(3)
    data = cmt_test_data['random_batch']((3, 2))
    (cmt_scores, cmt_boxes), (aqr_scores, aqr_boxes) = _predictions(cmt, data), _predictions(aqr, data)
    assert torch.isfinite(cmt_boxes).all() and cmt_boxes.abs().max() > 0.1
    assert (aqr_scores - cmt_scores).abs().max() <= 1e-5
    assert (aqr_boxes - cmt_boxes).abs().max() <= 1e-4


def test_the_router_moves_from_the_first_step(cmt_checkpoint, cmt_test_data):
    pair, path = cmt_checkpoint
    aqr = _model(cmt_test_data, PAIRS[pair][1], seed=2)
    load_detector_checkpoint(aqr, path)
    router = {name: value.detach().clone() for name, value in aqr.named_parameters()
              if name.startswith('pts_bbox_head.aqr_weight_generator.weight_head')}
    optimizer = torch.optim.SGD([p for p in aqr.parameters() if p.requires_grad], lr=0.1)
    aqr.train()
    torch.manual_seed(4)
    outputs = aqr.train_step(cmt_test_data['random_batch']((3, 2)), optimizer=None)
    outputs['loss'].backward()
    optimizer.step()
    moved = {name: float((param.detach() - router[name]).abs().max()) for name, param in aqr.named_parameters()
             if name in router}
    assert sorted(moved) == ['pts_bbox_head.aqr_weight_generator.weight_head.bias',
                             'pts_bbox_head.aqr_weight_generator.weight_head.weight']
    assert all(change > 0 for change in moved.values()), moved


def test_a_missing_file_is_named(tmp_path):
    missing = str(tmp_path / 'no_such_cmt.pth')
    with pytest.raises(FileNotFoundError, match=f"load_from: no checkpoint file at '{missing}'"):
        load_detector_checkpoint(torch.nn.Linear(1, 1), missing, purpose='load_from')


def test_a_checkpoint_of_another_config_is_refused_with_its_tensors(tmp_path, cmt_test_data):
    vov = _model(cmt_test_data, PAIRS['vov'][0], seed=0)
    path = str(tmp_path / 'vov.pth')
    save_checkpoint(vov, path)
    r50 = _model(cmt_test_data, PAIRS['r50'][1], seed=0)
    before = {name: value.clone() for name, value in r50.state_dict().items()}
    with pytest.raises(ValueError, match=r'tensors differ in shape from the model\'s \(a checkpoint of another '
                                         r'config\?\): img_neck\.'):
        load_detector_checkpoint(r50, path, purpose='load_from')
    assert all(torch.equal(value, before[name]) for name, value in r50.state_dict().items())  # nothing copied
