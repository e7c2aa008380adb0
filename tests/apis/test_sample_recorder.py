"""apis/sample_recorder.py: what the demo CMT-AQR model was given and what it detected, per tested sample."""
import numpy as np
import pytest
import torch
from mmcv import Config
from mmdet3d.models import build_model

from projects.mmdet3d_plugin.apis.attention_mass import fused_cross_attention, record_camera_mass
from projects.mmdet3d_plugin.apis.decoder_capture import capture_decoder
from projects.mmdet3d_plugin.apis.sample_recorder import record_samples
from projects.mmdet3d_plugin.diagnostics.synthetic_batch import random_demo_batch
from projects.mmdet3d_plugin.models.aqr.routing_targets import count_points_in_boxes


class GroundTruth:
    """A dataset stand-in: the batch's boxes as each sample's annotations, an unknown class (-1) added last."""

    def __init__(self, batch):
        self.data_infos = [dict(token=f't{index}') for index in range(len(batch['points']))]
        self.batch = batch

    def get_ann_info(self, index):
        boxes = self.batch['gt_bboxes_3d'][index]
        extra = boxes.new_box(torch.cat([boxes.tensor, boxes.tensor[:1]]))
        labels = np.append(self.batch['gt_labels_3d'][index].numpy(), -1)
        return dict(gt_bboxes_3d=extra, gt_labels_3d=labels)


def _model_and_batch(config):
    cfg = Config.fromfile(config)
    model = build_model(cfg.model, test_cfg=cfg.get('test_cfg')).eval()
    batch = random_demo_batch(cfg, (4, 3), 'cpu', torch.Generator().manual_seed(0))
    batch['img_metas'] = [dict(meta, sample_idx=f't{index}') for index, meta in enumerate(batch['img_metas'])]
    batch['img_metas'][1]['corruption'] = dict(name='view_drop:2', views=[2])
    return cfg, model, batch


def _test(model, batch):
    with torch.no_grad():
        return model(return_loss=False, points=[batch['points']], img_metas=[batch['img_metas']], img=[batch['img']])


def test_every_tested_sample_leaves_its_inputs_detections_and_routing():
    cfg, model, batch = _model_and_batch('configs/demo/cmt_aqr_synthetic_tiny.py')
    with record_samples(model, GroundTruth(batch)) as observations:
        results = _test(model, batch)
    assert 'simple_test' not in vars(model), 'the wrapper is gone after the block'
    assert [o.token for o in observations] == ['t0', 't1']
    num_query, num_classes = cfg.model.pts_bbox_head.num_query, len(cfg.class_names)
    for observation, points, boxes, labels, result in zip(observations, batch['points'], batch['gt_bboxes_3d'],
                                                          batch['gt_labels_3d'], results):
        assert torch.equal(observation.gt_boxes, boxes.tensor) and torch.equal(observation.gt_labels, labels)
        assert torch.equal(observation.gt_points, count_points_in_boxes(points, boxes.tensor))
        assert observation.gt_points.sum() > 0
        detections = result['pts_bbox']
        assert len(detections['scores_3d']) > 0
        assert torch.equal(observation.det_centres, detections['boxes_3d'].tensor[:, :2])
        assert torch.equal(observation.det_scores, detections['scores_3d'])
        assert observation.query_centres.shape == (num_classes, num_query, 2)
        assert observation.query_scores.shape == (num_query, num_classes)
        assert observation.lidar_weights.shape == observation.camera_weights.shape == (num_query, )
        # every detection is the prediction of a query for its class: its centre and its score
        for centre, label, score in zip(observation.det_centres, observation.det_labels, observation.det_scores):
            at_centre = (observation.query_centres[label] - centre).norm(dim=-1) < 1e-5
            assert ((observation.query_scores[at_centre, label] - score).abs() < 1e-6).any()
        assert observation.lidar2img.shape == (6, 4, 4)
    assert observations[0].camera_meta == dict(pad_shape=batch['img_metas'][0]['pad_shape'])
    assert observations[1].camera_meta['corruption']['views'] == [2]
    # the weights are those AQR used: different per query, the same as a second run
    assert observations[0].lidar_weights.std() > 0
    with record_samples(model, GroundTruth(batch)) as again:
        _test(model, batch)
    assert torch.equal(again[1].camera_weights, observations[1].camera_weights)


def test_attention_mass_is_each_querys_share_on_the_camera_keys_on_request():
    cfg, model, batch = _model_and_batch('configs/demo/cmt_aqr_synthetic_tiny.py')
    with record_samples(model, GroundTruth(batch), attention_mass=True) as observations:
        _test(model, batch)
    with record_samples(model, GroundTruth(batch)) as without:
        _test(model, batch)
    assert without[0].camera_mass is None
    for observation in observations:
        mass = observation.camera_mass
        assert mass.shape == (cfg.model.pts_bbox_head.num_query, ) and mass.std() > 0
        assert ((mass >= 0) & (mass <= 1)).all()
    assert not torch.equal(observations[0].camera_mass, observations[1].camera_mass)  # each sample its own


def test_camera_mass_sums_the_fused_attention_over_the_camera_keys():
    """The recorded mass against the last cross-attention's probabilities summed over the keys after the BEV
    (its size read from the decoder's input by capture_decoder)."""
    _, model, batch = _model_and_batch('configs/demo/cmt_aqr_synthetic_tiny.py')
    head = model.pts_bbox_head
    calls = []
    handle = fused_cross_attention(head).register_forward_hook(
        lambda module, args, kwargs, output: calls.append((module, args[:2], kwargs)), with_kwargs=True)
    try:
        with capture_decoder(head) as snapshot, record_camera_mass(head) as mass:
            _test(model, batch)
    finally:
        handle.remove()
    (module, (query, key), kwargs), = calls
    bev_keys = snapshot.bev_shape[0] * snapshot.bev_shape[1]
    assert bev_keys < key.size(1)
    with torch.no_grad():
        weights = module.attention_weights(query, key, bias=kwargs['bias'],
                                           key_padding_mask=kwargs['key_padding_mask'])
    torch.testing.assert_close(mass.latest, weights[..., bev_keys:].sum(-1).mean(1))
    torch.testing.assert_close(1 - mass.latest, weights[..., :bev_keys].sum(-1).mean(1))


def test_plain_cmt_has_no_routing_and_unknown_samples_are_refused():
    _, model, batch = _model_and_batch('configs/demo/cmt_synthetic_tiny.py')
    with record_samples(model, GroundTruth(batch)) as observations:
        _test(model, batch)
    assert len(observations) == 2 and not observations[0].has_routing and observations[0].query_scores is None
    batch['img_metas'][0]['sample_idx'] = 'elsewhere'
    with pytest.raises(KeyError, match="'elsewhere', not a sample of the dataset"):
        with record_samples(model, GroundTruth(batch)):
            _test(model, batch)
    assert 'simple_test' not in vars(model)
