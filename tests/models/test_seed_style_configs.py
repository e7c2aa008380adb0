"""Configs in the design notes' vocabulary (shared/seeds 000-002) build with their meaning or fail naming the key."""
import copy
import logging

import pytest
import torch
from mmcv.cnn.bricks.registry import ATTENTION
from mmdet.models.builder import MODELS
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention import BACKENDS, dispatch
from projects.mmdet3d_plugin.models.aqr.routing_layer_config import routing_layer_args

SEED_CONFIG = 'design_notes/cmt_aqr_voxel0100_r50_800x320_cbgs'


def _encoder_config(**attn_options):
    """Seed 002's routing layer: ``aqr_config.encoder_config.transformerlayers.attn_cfgs``."""
    attn = dict(type='PETRMultiheadFlashAttention', embed_dims=64, num_heads=4, dropout=0.1, use_flashbias=True)
    return dict(
        type='DetrTransformerEncoder',
        num_layers=1,
        transformerlayers=dict(
            type='BaseTransformerLayer',
            attn_cfgs=[dict(attn, **attn_options)],
            feedforward_channels=96,
            ffn_dropout=0.1,
            operation_order=('cross_attn', 'norm', 'ffn', 'norm')))


def _build(cfg):
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


def _shapes(model):
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def test_encoder_config_sets_the_routing_layer_sizes(caplog):
    with caplog.at_level(logging.INFO, logger='mmdet'):
        generator = MODELS.build(dict(type='AQRWeightGenerator', encoder_config=_encoder_config()))
    assert generator.embed_dims == 64
    assert generator.attention.num_heads == 4
    assert generator.ffn.layers[0][0].out_features == 96
    assert generator.attn_dropout.p == 0.1
    assert 'use_flashbias=True; flashbias does not apply to the routing layer' in caplog.text
    direct = MODELS.build(dict(type='AQRWeightGenerator', embed_dims=64, num_heads=4, feedforward_channels=96))
    assert _shapes(direct) == _shapes(generator)


def test_encoder_config_given_as_the_layer_itself():
    layer = _encoder_config()['transformerlayers']
    assert routing_layer_args(layer) == dict(num_heads=4, use_flashbias=True, embed_dims=64,
                                             feedforward_channels=96, dropout=0.1)


@pytest.mark.parametrize('change, message', [
    (lambda c: c['transformerlayers']['attn_cfgs'][0].update(type='MultiScaleDeformableAttention'),
     r'encoder_config\.transformerlayers\.attn_cfgs\[0\]\.type=.*PETRMultiheadFlashAttention'),
    (lambda c: c.update(num_layers=2), r'encoder_config\.num_layers=2'),
    (lambda c: c['transformerlayers']['attn_cfgs'][0].update(type='MultiheadAttention'),
     r"attn_cfgs\[0\]\.use_flashbias is an option of type='PETRMultiheadFlashAttention'"),
    (lambda c: c['transformerlayers'].update(operation_order=('self_attn', 'norm', 'ffn', 'norm')),
     r'encoder_config\.transformerlayers\.operation_order'),
    (lambda c: c['transformerlayers'].update(ffn_dropout=0.0), 'one dropout rate'),
    (lambda c: c['transformerlayers']['attn_cfgs'][0].update(backend='sdpa'), r"attn_cfgs\[0\]\.backend='sdpa'"),
    (lambda c: c['transformerlayers'].update(batch_frist=True), r"unsupported key\(s\) \['batch_frist'\]"),
    (lambda c: c['transformerlayers'].update(ffn_cfgs=dict(act_cfg=dict(type='GELU'))), r'ffn_cfgs\.act_cfg'),
    (lambda c: c['transformerlayers'].update(attn_cfgs=[dict(type='MultiheadAttention', num_heads=4)] * 2),
     'exactly one config'),
])
def test_encoder_config_the_layer_cannot_honour_names_the_key(change, message):
    encoder_config = _encoder_config()
    change(encoder_config)
    with pytest.raises(ValueError, match=message):
        MODELS.build(dict(type='AQRWeightGenerator', encoder_config=encoder_config))


def test_encoder_config_conflicting_with_an_argument_raises():
    with pytest.raises(ValueError, match='num_heads=8 but encoder_config sets num_heads=4'):
        MODELS.build(dict(type='AQRWeightGenerator', num_heads=8, encoder_config=_encoder_config()))


def _spy_flashbias(monkeypatch):
    calls = []
    backend = BACKENDS['flashbias']
    forward = backend.forward

    def spy(call):
        calls.append(call)
        return forward(call)

    monkeypatch.setattr(backend, 'forward', spy)
    return calls


def test_use_flashbias_prefers_flashbias_and_falls_back_with_a_log(monkeypatch, caplog):
    torch.manual_seed(0)
    preferred = ATTENTION.build(dict(type='PETRMultiheadFlashAttention', embed_dims=16, num_heads=2,
                                     use_flashbias=True))
    reference = ATTENTION.build(dict(type='PETRMultiheadFlashAttention', embed_dims=16, num_heads=2, backend='math'))
    reference.load_state_dict(preferred.state_dict())
    query, key = torch.randn(5, 2, 16), torch.randn(7, 2, 16)
    calls = _spy_flashbias(monkeypatch)
    monkeypatch.setattr(dispatch, '_LOGGED', set())
    torch.testing.assert_close(preferred(query, key), reference(query, key), rtol=1e-5, atol=1e-5)
    assert len(calls) == 1
    window = torch.rand(5, 7) > 0.5
    window[:, 0] = True
    with caplog.at_level(logging.INFO, logger='mmdet'):
        out = preferred(query, key, attn_mask=window)
    torch.testing.assert_close(out, reference(query, key, attn_mask=window), rtol=1e-5, atol=1e-5)
    assert len(calls) == 1, 'flashbias cannot apply a dense mask; the fallback must not call it'
    assert "backend 'sdpa'" in caplog.text and 'skipped flashbias (flashbias applies only low-rank' in caplog.text


def test_use_flashbias_with_another_backend_or_module_raises():
    with pytest.raises(ValueError, match='use_flashbias is an option of PETRMultiheadFlashAttention'):
        ATTENTION.build(dict(type='PETRMultiheadAttention', embed_dims=16, num_heads=2, use_flashbias=True))
    with pytest.raises(ValueError, match="prefer='flashbias' needs backend='auto'"):
        dispatch.apply_attention(*torch.randn(3, 1, 1, 2, 4), backend='math', prefer='flashbias')
    with pytest.raises(ValueError, match="needs backend='auto', got backend='sdpa'"):
        ATTENTION.build(dict(type='PETRMultiheadFlashAttention', embed_dims=16, num_heads=2, backend='sdpa',
                             use_flashbias=True))


def test_head_design_note_keys(cmt_test_data, caplog):
    aqr_cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    plain_cfg = cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs')
    off = copy.deepcopy(aqr_cfg)
    off.model.pts_bbox_head.enable_aqr = False
    with caplog.at_level(logging.INFO, logger='mmdet'):
        model = _build(off)
    assert not model.pts_bbox_head.with_query_routing
    assert _shapes(model) == _shapes(_build(plain_cfg))
    assert 'enable_aqr=False, so aqr_config, attention_bias_config are not built' in caplog.text
    broken = copy.deepcopy(plain_cfg)
    broken.model.pts_head = dict(enable_aqr=True)
    with pytest.raises(ValueError, match='pts_head .* the head.s key is pts_bbox_head'):
        _build(broken)
    for options, message in (
            (dict(enable_aqr=True), 'enable_aqr=True needs aqr_config'),
            (dict(renderer_config=dict(type='WeightRenderer')), 'renderer_config .* use weight_renderer_config'),
            (dict(modulator_config=dict(type='FeatureModulator')),
             'modulator_config .* use feature_modulator_config'),
            (dict(aqr_bias_strength=5.0), r'aqr_bias_strength .* use attention_bias_config=.*bias_scale'),
            (dict(aqr_use_local_bias=False), r'aqr_use_local_bias .* use attention_bias_config=.*use_local_bias'),
    ):
        broken = copy.deepcopy(plain_cfg)
        broken.model.pts_bbox_head.update(options)
        with pytest.raises(ValueError, match=message):
            _build(broken)


@pytest.mark.parametrize('key, value, message', [
    ('bias_strength', 5.0, 'bias_strength .* use bias_scale'),
    ('bev_feature_shape', (180, 180), 'bev_feature_shape .* read from the BEV feature tensor'),
    ('pers_feature_shape', (6, 40, 100), 'pers_feature_shape .* read from the image feature tensor'),
])
def test_bias_generator_design_note_keys_name_their_replacement(key, value, message):
    with pytest.raises(ValueError, match=message):
        MODELS.build(dict(type='AttentionBiasGenerator', window_size=5, **{key: value}))


@pytest.mark.parametrize('name', ['cmt_aqr_voxel0100_r50_800x320_cbgs', 'cmt_aqr_voxel0075_vov_1600x640_cbgs'])
def test_seed_style_configs_build_the_plain_aqr_model(name, cmt_test_data):
    model = _build(cmt_test_data['reduced_config'](f'design_notes/{name}'))
    layer = model.pts_bbox_head.transformer.decoder.layers[0]
    assert model.pts_bbox_head.with_query_routing
    assert layer.attentions[1].attn.prefer_flashbias
    if 'vov' in name:
        assert layer.attentions[0].attn.prefer_flashbias and layer.attentions[0].attn.attn_drop == 0.1
    assert _shapes(model) == _shapes(_build(cmt_test_data['reduced_config'](name)))


def test_seed_style_r50_config_trains_one_step(cmt_test_data):
    model = _build(cmt_test_data['reduced_config'](SEED_CONFIG))
    outputs = cmt_test_data['train_step'](model, cmt_test_data['random_batch']())
    assert torch.isfinite(outputs['loss'])
    assert model.pts_bbox_head.aqr_weight_generator.weight_head.weight.grad.abs().sum() > 0
