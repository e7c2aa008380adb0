"""``fused_image_drop_prob``: the fused pass (and its routing) decodes black camera views, the other passes the real ones."""
import pytest
import torch
from mmdet3d.models import build_model
from torch._subclasses.fake_tensor import FakeTensorMode

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.utils.camera_blanking import (FusedBlankViews, black_camera_images,
                                                                  blank_camera_views, replace_sample_views,
                                                                  with_dropped_images)
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry
from test_cmt_head import features, head_cfg

AQR = dict(aqr_config=dict(type='AQRWeightGenerator', window_sizes=[3, 3]),
           attention_bias_config=dict(type='AttentionBiasGenerator', window_size=3, bias_scale=2.0))
PASSES = dict(modality_passes=('fused', 'camera'), pass_decoders='separate',
              camera_window_prior=dict(window_size=3, bias=4.0))  # the camera pass's bias: not the fused routing's
NORM = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)


def test_black_camera_images_are_black_pixels_normalised_with_zero_padding():
    img = torch.rand(2, 3, 3, 8, 12)
    img_metas = [dict(img_shape=[(8, 12, 3)] * 3, img_norm_cfg=NORM), dict(img_shape=(6, 10, 3), img_norm_cfg=NORM)]
    black = black_camera_images(img, img_metas)
    assert black.shape == img.shape
    expected = torch.tensor([-m / s for m, s in zip(NORM['mean'], NORM['std'])])
    torch.testing.assert_close(black[0, 2, :, 4, 7], expected)
    torch.testing.assert_close(black[1, 1, :, 5, 9], expected)
    assert (black[1, :, :, 6:] == 0).all() and (black[1, :, :, :, 10:] == 0).all(), 'padding stays 0'
    assert blank_camera_views(black, img_metas).all(), 'what camera_free_pass calls blank'
    with pytest.raises(KeyError, match="add 'img_norm_cfg' to Collect3D's meta_keys"):
        black_camera_images(img, [dict(img_shape=(8, 12, 3))] * 2)
    with pytest.raises(ValueError, match='3 channels but the images have 1'):
        black_camera_images(img[:, :, :1], img_metas)


def test_black_camera_images_trace_on_fake_cuda():
    img_metas = [dict(img_shape=[(8, 12, 3)] * 3, img_norm_cfg=NORM)]
    with FakeTensorMode(allow_non_fake_inputs=True):
        black = black_camera_images(torch.zeros(1, 3, 3, 8, 12, device='cuda'), img_metas)
        assert (black.shape, black.device.type) == ((1, 3, 3, 8, 12), 'cuda')


def test_replace_sample_views_replaces_the_flagged_samples_views_only():
    feats = torch.randn(3 * 2, 4, 2, 5, requires_grad=True)
    replacement = torch.randn(2, 4, 2, 5, requires_grad=True)
    merged = replace_sample_views(feats, (False, True, False), replacement)
    torch.testing.assert_close(merged[2:4], replacement, rtol=0, atol=0)
    torch.testing.assert_close(merged[[0, 1, 4, 5]], feats[[0, 1, 4, 5]], rtol=0, atol=0)
    merged.sum().backward()
    assert feats.grad[[0, 1, 4, 5]].eq(1).all() and feats.grad[2:4].eq(0).all() and replacement.grad.eq(1).all()
    with pytest.raises(ValueError, match='cannot replace the views of 2 of 3 samples'):
        replace_sample_views(feats, (True, True, False), replacement)


def test_with_dropped_images_marks_copies():
    img_metas = [dict(dropped_modalities=['points']), dict(), dict(dropped_modalities=['image'])]
    marked = with_dropped_images(img_metas, (True, True, True))
    assert [meta['dropped_modalities'] for meta in marked] == [['points', 'image'], ['image'], ['image']]
    assert img_metas[0]['dropped_modalities'] == ['points'] and 'dropped_modalities' not in img_metas[1]


def decode(head, bev, img, img_metas, boxes, labels, fused_blank_views=None):
    torch.manual_seed(1)  # the same DN queries
    preds = head([bev], [img], img_metas, boxes, labels, fused_blank_views=fused_blank_views)
    fused = torch.cat([task[0]['cls_logits'] for task in preds], dim=-1)
    camera = torch.cat([task[0]['cls_logits'] for task in preds.passes['camera'].tasks], dim=-1)
    return preds, fused, camera


def test_fused_pass_and_routing_decode_the_black_views_and_the_camera_pass_the_real_ones(cmt_test_data):
    head = head_cfg(fused_image_drop_prob=0.5, **PASSES, **AQR).train()
    bev, img = features()
    black = torch.randn(img.size(0) // 2, *img.shape[1:])
    img_metas = cmt_test_data['make_img_metas'](2)
    boxes = [cmt_test_data['random_boxes'](2), cmt_test_data['random_boxes'](1)]
    labels = [torch.tensor([0, 3]), torch.tensor([1])]
    img_with_black = torch.cat((img[:2], black))  # sample 1's views black, for every pass
    _, real_fused, real_camera = decode(head, bev, img, img_metas, boxes, labels)
    _, black_fused, _ = decode(head, bev, img_with_black, img_metas, boxes, labels)
    preds, fused, camera = decode(head, bev, img, img_metas, boxes, labels, FusedBlankViews((False, True), black))
    torch.testing.assert_close(fused, black_fused, rtol=0, atol=0)
    torch.testing.assert_close(camera, real_camera, rtol=0, atol=0)
    assert not torch.allclose(fused[:, 1], real_fused[:, 1])
    routing_metas = preds.routing.img_metas
    assert [meta.get('dropped_modalities', []) for meta in routing_metas] == [[], ['image']]
    assert preds.passes['camera'].trained_samples == (True, True)
    assert 'dropped_modalities' not in img_metas[1], "the caller's metas unchanged"


def test_camera_depth_position_lifts_the_black_views_at_their_own_depth(cmt_test_data):
    head = head_cfg(fused_image_drop_prob=0.5, image_aux_config=dict(type='ImageAuxHead'), camera_depth_position=True,
                    **PASSES, **AQR).train()
    bev, img = features()
    black = torch.randn(img.size(0) // 2, *img.shape[1:])
    img_metas = cmt_test_data['make_img_metas'](2)
    boxes = [cmt_test_data['random_boxes'](2), cmt_test_data['random_boxes'](1)]
    labels = [torch.tensor([0, 3]), torch.tensor([1])]
    depth_inputs, frustum_inputs = [], []
    token_depth_pos_embed, frustum_pos_embed = head.positions.token_depth, head.positions.frustum
    head.positions.token_depth = lambda depth, geometry: (depth_inputs.append(depth)
                                                          or token_depth_pos_embed(depth, geometry))
    head.positions.frustum = lambda feat, geometry: frustum_inputs.append(feat) or frustum_pos_embed(feat, geometry)
    preds, _, _ = decode(head, bev, img, img_metas, boxes, labels, FusedBlankViews((False, True), black))
    real_depth, fused_depth = depth_inputs
    assert len(frustum_inputs) == 1, 'the black views keep the frustum embedding of the real ones'
    with torch.no_grad():  # in training mode, as the head ran it: BatchNorm on the statistics of both batches
        geometry = CameraGeometry.from_metas(img_metas + img_metas[1:])
        expected_depth = head.image_aux_head(torch.cat((img, black)), img_metas + img_metas[1:], geometry).depth[:, 0]
    torch.testing.assert_close(real_depth, expected_depth[:4])
    torch.testing.assert_close(fused_depth, torch.cat((expected_depth[:2], expected_depth[4:])))
    image_aux = preds.image_aux
    assert image_aux.heatmap.size(0) == img.size(0) and image_aux.trained == (True, True)
    losses = head.loss(boxes, labels, preds)
    assert all(torch.isfinite(value).all() for value in losses.values())


def test_detector_draws_samples_and_runs_their_black_views_through_the_backbone(cmt_test_data, monkeypatch):
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    cfg.model.pts_bbox_head.update(fused_image_drop_prob=0.5, **PASSES)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    data = cmt_test_data['random_batch']((3, 2))
    for meta in data['img_metas']:
        meta['img_norm_cfg'] = NORM
    monkeypatch.setattr(model.pts_bbox_head, 'draw_fused_image_drops', lambda img_metas: (False, True))
    model.eval()
    with torch.no_grad():
        img_feats, pts_feats, blank = model.extract_train_feat(data['points'], data['img'], data['img_metas'])
        expected_real, expected_pts = model.extract_feat(data['points'], img=data['img'], img_metas=data['img_metas'])
        expected_black = model.extract_img_feat(black_camera_images(data['img'][1:], data['img_metas'][1:]),
                                                data['img_metas'][1:])
    assert blank.samples == (False, True)
    torch.testing.assert_close(img_feats[0], expected_real[0])
    torch.testing.assert_close(pts_feats[0], expected_pts[0])
    torch.testing.assert_close(blank.img_feat, expected_black[0])
    heads_inputs = []
    forward = model.pts_bbox_head.forward
    monkeypatch.setattr(model.pts_bbox_head, 'forward',
                        lambda *args, **kwargs: heads_inputs.append(kwargs) or forward(*args, **kwargs))
    outputs = cmt_test_data['train_step'](model, data)
    assert torch.isfinite(outputs['loss']) and heads_inputs[0]['fused_blank_views'].samples == (False, True)
    assert outputs['log_vars']['fused.num_black_camera_samples'] == 1
    assert outputs['log_vars']['camera.num_samples'] == 2, 'the camera pass keeps the real images'
    monkeypatch.setattr(model.pts_bbox_head, 'draw_fused_image_drops', lambda img_metas: (False, False))
    outputs = cmt_test_data['train_step'](model, data)
    assert outputs['log_vars']['fused.num_black_camera_samples'] == 0, 'the log keys do not change between steps'
    assert 'fused_blank_views' not in heads_inputs[-1]


def test_draws_follow_the_probability_and_skip_samples_without_images(cmt_test_data):
    head = head_cfg(fused_image_drop_prob=0.5, **PASSES)
    img_metas = [dict(dropped_modalities=['image']), dict()] * 200
    draws = torch.tensor([head.draw_fused_image_drops(img_metas) for _ in range(5)])
    assert not draws[:, 0::2].any()
    assert 0.4 < draws[:, 1::2].float().mean() < 0.6
    default = head_cfg(**PASSES)
    state = torch.get_rng_state()
    assert default.draw_fused_image_drops(img_metas) == (False, ) * 400
    assert torch.equal(torch.get_rng_state(), state), 'the default draws nothing'


def test_bad_fused_image_drop_options_raise():
    with pytest.raises(ValueError, match=r'fused_image_drop_prob must be in \[0, 1\)'):
        head_cfg(fused_image_drop_prob=1.0)
    with pytest.raises(ValueError, match='this head decodes one modality'):
        head_cfg('CmtLidarHead', 'CmtLidarTransformer', fused_image_drop_prob=0.25)
    with pytest.raises(ValueError, match="needs modulation='attention_bias'"):
        head_cfg(fused_image_drop_prob=0.25, modulation='feature', aqr_config=AQR['aqr_config'])
    with pytest.raises(ValueError, match='fused_blank_views is a training input'):
        bev, img = features()
        head_cfg(fused_image_drop_prob=0.25).eval()([bev], [img], [dict()] * 2,
                                                    fused_blank_views=FusedBlankViews((False, True), img[:2]))
