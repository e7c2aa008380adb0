"""AQR inside CMT: configs, the bias reaching every decoder layer, gradients, checkpoints, legacy modulation."""
import copy

import pytest
import torch
from mmcv import Config
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention import AttentionBias
from projects.mmdet3d_plugin.models.dense_heads.query_router import QueryRouting, routing_of
from projects.mmdet3d_plugin.models.utils import petr_attention

AQR_CONFIGS = ('cmt_aqr_voxel0100_r50_800x320_cbgs', 'cmt_aqr_voxel0075_vov_1600x640_cbgs')
AQR_PREFIXES = ('pts_bbox_head.aqr_weight_generator.', 'pts_bbox_head.attention_bias_generator.')


def _build(cfg):
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


def _aqr_cfg(cmt_test_data, name='cmt_aqr_voxel0100_r50_800x320_cbgs', **bias_options):
    cfg = cmt_test_data['reduced_config'](name)
    cfg.model.pts_bbox_head.attention_bias_config.update(bias_options)
    return cfg


def _test_step(model, data):
    model.eval()
    with torch.no_grad():
        return model.forward(return_loss=False, img_metas=[data['img_metas']], points=[data['points']],
                             img=[data['img']])


@pytest.mark.parametrize('name', AQR_CONFIGS)
def test_aqr_configs_train_and_test_with_batch_of_two(name, cmt_test_data):
    cfg = cmt_test_data['reduced_config'](name)
    head_cfg = cfg.model.pts_bbox_head
    assert head_cfg.aqr_config.type == 'AQRWeightGenerator'
    assert head_cfg.attention_bias_config == dict(type='AttentionBiasGenerator', window_size=15, bias_scale=1.0,
                                                  use_local_bias=True, fp16=True)
    baseline = Config.fromfile(f'configs/{name.replace("cmt_aqr_", "cmt_")}.py').model.pts_bbox_head
    assert set(Config.fromfile(f'configs/{name}.py').model.pts_bbox_head) - set(baseline) == {
        'aqr_config', 'attention_bias_config'}, 'an AQR config only adds the two AQR dicts to the CMT head'
    model = _build(cfg)
    data = cmt_test_data['random_batch']((3, 2))
    outputs = cmt_test_data['train_step'](model, data)
    assert torch.isfinite(outputs['loss'])
    head = model.pts_bbox_head
    assert head.attention_bias_generator.bias_scale.grad.abs().sum() > 0, 'no gradient reached bias_scale'
    no_grad = [n for n, p in head.aqr_weight_generator.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not no_grad, f'AQR parameters without gradient from the detection loss: {no_grad}'
    results = _test_step(model, data)
    assert len(results) == 2
    for result in results:
        assert len(result['pts_bbox']['boxes_3d']) > 0 and torch.isfinite(result['pts_bbox']['boxes_3d'].tensor).all()


def test_gradients_reach_aqr_through_checkpointed_decoder_layers(cmt_test_data):
    """with_cp recomputes each layer in the backward pass; the bias must still carry gradients."""
    cfg = _aqr_cfg(cmt_test_data)
    cfg.model.pts_bbox_head.transformer.decoder.transformerlayers.with_cp = True
    model = _build(cfg)
    outputs = cmt_test_data['train_step'](model, cmt_test_data['random_batch']((2, 1)))
    head = model.pts_bbox_head
    assert torch.isfinite(outputs['loss'])
    assert head.attention_bias_generator.bias_scale.grad.abs().sum() > 0
    assert head.aqr_weight_generator.weight_head.weight.grad.abs().sum() > 0


def test_zero_bias_scale_gives_the_baseline_outputs(cmt_test_data):
    """Same weights, same features, alpha = 0: bit-identical predictions.

    Compared at the head, on one set of features: spconv's CPU kernels are not
    deterministic from run to run (about 4e-6), which has nothing to do with AQR.
    """
    baseline_cfg = cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs')
    aqr_cfg = _aqr_cfg(cmt_test_data, bias_scale=0.0)
    for cfg in (baseline_cfg, aqr_cfg):
        for attn_cfg in cfg.model.pts_bbox_head.transformer.decoder.transformerlayers.attn_cfgs:
            if attn_cfg['type'] == 'PETRMultiheadFlashAttention':
                attn_cfg['backend'] = 'math'
    baseline, aqr = _build(baseline_cfg).eval(), _build(aqr_cfg).eval()
    missing, unexpected = aqr.load_state_dict(baseline.state_dict(), strict=False)
    assert not unexpected
    assert missing and all(key.startswith(AQR_PREFIXES) for key in missing), missing
    data = cmt_test_data['random_batch']((2, 1))
    with torch.no_grad():
        img_feats, pts_feats = baseline.extract_feat(data['points'], data['img'], data['img_metas'])
        expected = baseline.pts_bbox_head(pts_feats, img_feats, data['img_metas'])
        actual = aqr.pts_bbox_head(pts_feats, img_feats, data['img_metas'])
    assert routing_of(actual) is not None and routing_of(expected) is None
    for expected_task, actual_task in zip(expected, actual):
        for key, value in expected_task[0].items():
            assert torch.equal(value, actual_task[0][key]), key


def test_baseline_state_dict_is_unchanged_and_checkpoint_loads_with_only_aqr_keys_missing(cmt_test_data):
    baseline_cfg = cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs')
    baseline = _build(baseline_cfg)
    explicit_none = copy.deepcopy(baseline_cfg)
    explicit_none.model.pts_bbox_head.update(aqr_config=None, attention_bias_config=None)
    assert list(_build(explicit_none).state_dict()) == list(baseline.state_dict())
    aqr = _build(_aqr_cfg(cmt_test_data))
    aqr_keys = set(aqr.state_dict())
    assert set(baseline.state_dict()) <= aqr_keys
    assert all(key.startswith(AQR_PREFIXES) for key in aqr_keys - set(baseline.state_dict()))
    assert 'pts_bbox_head.attention_bias_generator.bias_scale' in aqr_keys


class _CameraMassRecorder:
    """Wraps apply_attention: records the largest attention mass that a query with a negative camera bias
    puts on the camera keys, in every cross-attention call."""

    def __init__(self, original, num_bev):
        self.original, self.num_bev, self.masses, self.biases = original, num_bev, [], []

    def __call__(self, q, k, v, bias=None, **kwargs):
        if isinstance(bias, AttentionBias):
            self.biases.append(bias)
            scores = torch.einsum('bhqd,bhkd->bhqk', q.float(), k.float()) * q.size(-1)**-0.5
            dense = bias.to_dense()
            probs = (scores + dense).softmax(-1)
            biased = (dense[..., self.num_bev:] < 0).all(-1).expand_as(probs[..., 0])  # DN queries have no bias
            if biased.any():
                self.masses.append(probs[..., self.num_bev:].sum(-1)[biased].max().item())
        return self.original(q, k, v, bias=bias, **kwargs)


@pytest.mark.parametrize('with_cp', [False, True])
def test_negative_camera_bias_silences_camera_keys_in_every_layer(with_cp, cmt_test_data, monkeypatch):
    cfg = _aqr_cfg(cmt_test_data, use_local_bias=False, bias_scale=30.0, learnable_scale=False)
    cfg.model.pts_bbox_head.transformer.decoder.transformerlayers.with_cp = with_cp
    model = _build(cfg)
    generator = model.pts_bbox_head.aqr_weight_generator
    route = generator.forward

    def lidar_only(*args, **kwargs):
        lidar, camera, info = route(*args, **kwargs)
        return torch.ones_like(lidar), camera * 0, info

    monkeypatch.setattr(generator, 'forward', lidar_only)
    bev_cells = cfg.model.train_cfg.pts.grid_size[0] // cfg.model.pts_bbox_head.downsample_scale
    recorder = _CameraMassRecorder(petr_attention.apply_attention, bev_cells**2)
    monkeypatch.setattr(petr_attention, 'apply_attention', recorder)
    outputs = cmt_test_data['train_step'](model, cmt_test_data['random_batch']((2, 1)))
    num_layers = cfg.model.pts_bbox_head.transformer.decoder.num_layers
    # with_cp recomputes each layer in the backward pass: every call is recorded
    assert len(recorder.masses) == num_layers * (2 if with_cp else 1)
    assert max(recorder.masses) < 1e-6, recorder.masses
    assert torch.isfinite(outputs['loss'])


def test_local_bias_reaches_every_layer_and_dn_queries_get_none(cmt_test_data, monkeypatch):
    model = _build(_aqr_cfg(cmt_test_data, bias_scale=2.0))
    recorder = _CameraMassRecorder(petr_attention.apply_attention, 0)
    monkeypatch.setattr(petr_attention, 'apply_attention', recorder)
    model.train()
    data = cmt_test_data['random_batch']((3, 2))
    img_feats, pts_feats = model.extract_feat(data['points'], data['img'], data['img_metas'])
    preds = model.pts_bbox_head(pts_feats, img_feats, data['img_metas'], data['gt_bboxes_3d'], data['gt_labels_3d'])
    num_dn = preds.dn_queries.pad_size
    assert num_dn > 0
    assert len(recorder.biases) == 6 and all(bias is recorder.biases[0] for bias in recorder.biases)
    dense = recorder.biases[0].to_dense()
    assert torch.all(dense[:, :, :num_dn] == 0), 'DN queries must get zero bias'
    assert dense[:, :, num_dn:].abs().sum() > 0
    routing = routing_of(preds)
    assert isinstance(routing, QueryRouting) and routing.lidar_weights.shape == (2, cmt_test_data['num_query'])


def test_per_layer_bias_gives_each_layer_its_own_scale(cmt_test_data, monkeypatch):
    model = _build(_aqr_cfg(cmt_test_data, use_local_bias=False, per_layer=True))
    with torch.no_grad():
        model.pts_bbox_head.attention_bias_generator.bias_scale.copy_(torch.arange(6.0))
    recorder = _CameraMassRecorder(petr_attention.apply_attention, 0)
    monkeypatch.setattr(petr_attention, 'apply_attention', recorder)
    _test_step(model, cmt_test_data['random_batch']((1, )))
    assert len(recorder.biases) == 6
    values = [bias.parts[0].values for bias in recorder.biases]
    assert torch.all(values[0] == 0)
    for layer in range(1, 6):
        assert torch.allclose(values[layer], values[1] * layer)


def test_legacy_feature_modulation_and_aux_loss(cmt_test_data, monkeypatch):
    cfg = cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs')
    cfg.model.pts_bbox_head.update(
        aqr_config=dict(type='AQRWeightGenerator', window_sizes=[5, 3], aux_loss_weight=0.1), modulation='feature',
        weight_renderer_config=dict(type='WeightRenderer', kernel='window', window_size=3))
    model = _build(cfg)
    assert not hasattr(model.pts_bbox_head, 'attention_bias_generator') or \
        model.pts_bbox_head.attention_bias_generator is None
    recorder = _CameraMassRecorder(petr_attention.apply_attention, 0)
    monkeypatch.setattr(petr_attention, 'apply_attention', recorder)
    data = cmt_test_data['random_batch']((2, 1))
    data['img_metas'][0]['dropped_modalities'] = ['image']
    outputs = cmt_test_data['train_step'](model, data)
    assert not recorder.biases, 'feature modulation must not bias the attention'
    assert outputs['log_vars']['loss_aqr_routing'] > 0
    assert model.pts_bbox_head.aqr_weight_generator.weight_head.weight.grad.abs().sum() > 0


def test_bad_aqr_configs_raise(cmt_test_data):
    cfg = cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs')
    head = cfg.model.pts_bbox_head
    for options, message in (
            (dict(attention_bias_config=dict(type='AttentionBiasGenerator')), 'need aqr_config'),
            (dict(aqr_config=dict(type='AQRWeightGenerator')), 'needs attention_bias_config'),
            (dict(aqr_config=dict(type='AQRWeightGenerator'), modulation='weights'), 'modulation must be'),
            (dict(aqr_config=dict(type='AQRWeightGenerator'), attention_bias_config=dict(
                type='AttentionBiasGenerator', window_sze=15)), 'window_sze'),
    ):
        broken = copy.deepcopy(cfg)
        broken.model.pts_bbox_head = dict(head, **options)
        with pytest.raises((ValueError, TypeError), match=message):
            _build(broken)
    lidar_cfg = cmt_test_data['reduced_config']('cmt_lidar_voxel0075_cbgs')
    lidar_cfg.model.pts_bbox_head.update(aqr_config=dict(type='AQRWeightGenerator'),
                                         attention_bias_config=dict(type='AttentionBiasGenerator'))
    with pytest.raises(ValueError, match='fusion head'):
        _build(lidar_cfg)
