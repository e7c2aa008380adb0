"""Configs in the design notes' vocabulary (shared/seeds 000-002, configs/design_notes/) build, through
config_upgrade, the model they mean; the keys config_upgrade refuses are in test_config_upgrade.py."""
import copy
import logging

import pytest
import torch
from mmcv.cnn.bricks.registry import ATTENTION
from mmdet3d.models import build_model

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention import BACKENDS, dispatch

SEED_CONFIG = 'design_notes/cmt_aqr_voxel0100_r50_800x320_cbgs'


def _build(cfg):
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


def _shapes(model):
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


def _spy_flashbias(monkeypatch):
    calls = []
    backend = BACKENDS['flashbias']
    forward = backend.forward

    def spy(call):
        calls.append(call)
        return forward(call)

    monkeypatch.setattr(backend, 'forward', spy)
    return calls


def test_prefer_flashbias_runs_flashbias_and_falls_back_with_a_log(monkeypatch, caplog):
    torch.manual_seed(0)
    preferred = ATTENTION.build(dict(type='PETRMultiheadFlashAttention', embed_dims=16, num_heads=2,
                                     prefer='flashbias'))
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


def test_prefer_with_another_backend_raises():
    with pytest.raises(ValueError, match="prefer='flashbias' needs backend='auto'"):
        dispatch.apply_attention(*torch.randn(3, 1, 1, 2, 4), backend='math', prefer='flashbias')
    with pytest.raises(ValueError, match="needs backend='auto', got backend='sdpa'"):
        ATTENTION.build(dict(type='PETRMultiheadFlashAttention', embed_dims=16, num_heads=2, backend='sdpa',
                             prefer='flashbias'))


def test_head_design_note_keys_through_the_detector(cmt_test_data, caplog):
    aqr_cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs')
    plain_cfg = cmt_test_data['reduced_config']('cmt_voxel0100_r50_800x320_cbgs')
    off = copy.deepcopy(aqr_cfg)
    off.model.pts_bbox_head.enable_aqr = False
    with caplog.at_level(logging.INFO, logger='mmdet'):
        model = _build(off)
    assert not model.pts_bbox_head.with_query_routing
    assert _shapes(model) == _shapes(_build(plain_cfg))
    assert 'enable_aqr=False -> removed, plain CMT; not built: aqr_config, attention_bias_config' in caplog.text
    broken = copy.deepcopy(plain_cfg)
    broken.model.pts_head = dict(enable_aqr=True)
    with pytest.raises(ValueError, match='pts_head is a legacy key; use pts_bbox_head'):
        _build(broken)
    broken = copy.deepcopy(plain_cfg)
    broken.model.pts_bbox_head.update(renderer_config=dict(type='WeightRenderer'))
    with pytest.raises(ValueError, match=r'renderer_config is a legacy key; use routing=dict\(weight_renderer_config'):
        _build(broken)


@pytest.mark.parametrize('name', ['cmt_aqr_voxel0100_r50_800x320_cbgs', 'cmt_aqr_voxel0075_vov_1600x640_cbgs'])
def test_seed_style_configs_build_the_plain_aqr_model(name, cmt_test_data):
    model = _build(cmt_test_data['reduced_config'](f'design_notes/{name}'))
    layer = model.pts_bbox_head.transformer.decoder.layers[0]
    assert model.pts_bbox_head.with_query_routing
    assert layer.attentions[1].attn.prefer == 'flashbias'
    if 'vov' in name:
        assert layer.attentions[0].attn.prefer == 'flashbias' and layer.attentions[0].attn.attn_drop == 0.1
    assert _shapes(model) == _shapes(_build(cmt_test_data['reduced_config'](name)))


def test_seed_style_r50_config_trains_one_step(cmt_test_data):
    model = _build(cmt_test_data['reduced_config'](SEED_CONFIG))
    outputs = cmt_test_data['train_step'](model, cmt_test_data['random_batch']())
    assert torch.isfinite(outputs['loss'])
    assert model.pts_bbox_head.aqr_weight_generator.weight_head.weight.grad.abs().sum() > 0
