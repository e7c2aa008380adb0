"""config_upgrade: every legacy key is rewritten with one log line, or refused naming the key to use; the runtime
classes take current keys only and refuse a legacy key naming the current one and the upgrade."""
import copy
import logging
import re

import pytest
from mmcv.cnn.bricks.registry import ATTENTION
from mmdet.models.builder import MODELS, build_head
from mmdet.models.utils import build_transformer

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.config_upgrade import (LEGACY_KEYS, LEGACY_TYPES, LegacyKeyError,
                                                    upgrade_model_config)
from projects.mmdet3d_plugin.config_upgrade.routing_layer import routing_layer_args

UPGRADE = 'config_upgrade.upgrade_model_config'
FLASH = dict(type='PETRMultiheadFlashAttention', embed_dims=16, num_heads=2)


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


def _upgrade(cfg, caplog):
    """``upgrade_model_config(cfg)`` and its log lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger='mmdet'):
        upgraded = upgrade_model_config(cfg)
    return upgraded, [record.getMessage() for record in caplog.records if 'config upgrade' in record.getMessage()]


def test_use_flashbias_becomes_prefer(caplog):
    cfg = dict(type='CmtDetector', pts_bbox_head=dict(type='CmtHead', transformer=dict(decoder=dict(
        transformerlayers=dict(attn_cfgs=[dict(FLASH, use_flashbias=False), dict(FLASH, use_flashbias=True)])))))
    given = copy.deepcopy(cfg)
    upgraded, lines = _upgrade(cfg, caplog)
    attns = upgraded['pts_bbox_head']['transformer']['decoder']['transformerlayers']['attn_cfgs']
    assert attns == [FLASH, dict(FLASH, prefer='flashbias')]
    assert lines == [
        'config upgrade: model.pts_bbox_head.transformer.decoder.transformerlayers.attn_cfgs[0].use_flashbias=False '
        '-> removed',
        'config upgrade: model.pts_bbox_head.transformer.decoder.transformerlayers.attn_cfgs[1].use_flashbias=True '
        "-> model.pts_bbox_head.transformer.decoder.transformerlayers.attn_cfgs[1].prefer='flashbias'"]
    assert cfg == given, 'the given config is not changed'
    with pytest.raises(LegacyKeyError, match=r"use_flashbias=True and prefer='sdpa' disagree"):
        upgrade_model_config(dict(FLASH, use_flashbias=True, prefer='sdpa'))


@pytest.mark.parametrize('old, new', [('CmtLidarTransformer', 'CmtTransformer'),
                                      ('CmtImageTransformer', 'CmtTransformer')])
def test_transformer_aliases_become_cmt_transformer(old, new, caplog):
    upgraded, lines = _upgrade(dict(type=old, decoder=dict(type='PETRTransformerDecoder')), caplog)
    assert upgraded == dict(type=new, decoder=dict(type='PETRTransformerDecoder'))
    assert lines == [f"config upgrade: model.type='{old}' -> model.type='{new}'"]


@pytest.mark.parametrize('old, modalities', [('CmtLidarHead', ('lidar', )), ('CmtImageHead', ('camera', ))])
def test_head_aliases_become_cmt_head_with_their_tokens(old, modalities, caplog):
    upgraded, lines = _upgrade(dict(type=old, num_query=9), caplog)
    assert upgraded == dict(type='CmtHead', num_query=9, passes=dict(modalities=modalities))
    assert lines == [f"config upgrade: model.type='{old}' -> model.type='CmtHead', "
                     f'model.passes.modalities={modalities}']


def test_flat_head_keys_enable_aqr_and_norm_bbox(caplog):
    aqr = dict(type='AQRWeightGenerator', window_sizes=[3, 3])
    upgraded, lines = _upgrade(dict(type='CmtHead', scalar=5, split=0.5, aqr_config=aqr, enable_aqr=True,
                                    norm_bbox=True, init_cfg=None), caplog)
    assert upgraded == dict(type='CmtHead', denoising=dict(scalar=5, split=0.5), routing=dict(aqr_config=aqr))
    assert lines == [
        'config upgrade: model.norm_bbox=True -> removed (the head always regresses normalize_bbox codes)',
        'config upgrade: model.{scalar, split} -> model.denoising.*',
        'config upgrade: model.aqr_config -> model.routing.*',
        'config upgrade: model.enable_aqr=True -> removed (aqr_config is given, so AQR is on)']
    upgraded, lines = _upgrade(dict(type='CmtHead', routing=dict(aqr_config=aqr), enable_aqr=False), caplog)
    assert upgraded == dict(type='CmtHead', routing={})
    assert lines == ['config upgrade: model.enable_aqr=False -> removed, plain CMT; not built: aqr_config']


def test_encoder_config_becomes_the_routing_layer_sizes(caplog):
    upgraded, lines = _upgrade(dict(type='AQRWeightGenerator', encoder_config=_encoder_config()), caplog)
    assert upgraded == dict(type='AQRWeightGenerator', num_heads=4, embed_dims=64, feedforward_channels=96,
                            dropout=0.1)
    assert len(lines) == 1 and lines[0].startswith(
        'config upgrade: model.encoder_config -> model.{num_heads=4, embed_dims=64, feedforward_channels=96, '
        'dropout=0.1} (use_flashbias dropped: the routing layer applies its local window mask by gathering')
    generator = MODELS.build(upgraded)
    assert generator.embed_dims == 64 and generator.attention.num_heads == 4
    assert generator.ffn.layers[0][0].out_features == 96 and generator.attn_dropout.p == 0.1


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
        upgrade_model_config(dict(type='AQRWeightGenerator', encoder_config=encoder_config))


def test_encoder_config_conflicting_with_an_argument_raises():
    with pytest.raises(ValueError, match='num_heads=8 but encoder_config sets num_heads=4'):
        upgrade_model_config(dict(type='AQRWeightGenerator', num_heads=8, encoder_config=_encoder_config()))


@pytest.mark.parametrize('cfg, message', [
    (dict(type='CmtDetector', pts_head=dict(type='CmtHead')),
     r"model\.pts_head is a legacy key; use pts_bbox_head=dict\(type='CmtHead', \.\.\.\)"),
    (dict(type='CmtHead', renderer_config=dict(type='WeightRenderer')),
     r"model\.renderer_config is a legacy key; use routing=dict\(weight_renderer_config=\.\.\., modulation='feature'"),
    (dict(type='CmtHead', modulator_config=dict(type='FeatureModulator')),
     r'modulator_config is a legacy key; use routing=dict\(feature_modulator_config='),
    (dict(type='CmtHead', aqr_bias_strength=5.0), r'aqr_bias_strength is a legacy key; use .*bias_scale=\.\.\.'),
    (dict(type='CmtHead', aqr_use_local_bias=False), r'aqr_use_local_bias is a legacy key; use .*use_local_bias='),
    (dict(type='AttentionBiasGenerator', bias_strength=5.0), r'bias_strength is a legacy key; use bias_scale'),
    (dict(type='AttentionBiasGenerator', bev_feature_shape=(180, 180)),
     'bev_feature_shape is a legacy key; use nothing: the BEV grid size is read from the BEV feature tensor'),
    (dict(type='AttentionBiasGenerator', pers_feature_shape=(6, 40, 100)),
     'pers_feature_shape is a legacy key; use nothing: .* read from the image feature tensor'),
    (dict(type='PETRMultiheadAttention', use_flashbias=True),
     r"use_flashbias is a legacy key; use type='PETRMultiheadFlashAttention', prefer='flashbias'"),
])
def test_a_key_that_cannot_be_rewritten_is_refused_naming_the_key_to_use(cfg, message):
    with pytest.raises(LegacyKeyError, match=message + f'.*{UPGRADE} cannot rewrite it'):
        upgrade_model_config(cfg)


def test_a_config_in_current_keys_comes_back_unchanged(cmt_test_data, caplog):
    cfg = cmt_test_data['reduced_config']('cmt_aqr_voxel0100_r50_800x320_cbgs').model
    upgraded, lines = _upgrade(cfg, caplog)
    assert upgraded is not cfg and lines, 'the published configs write the head flat (upstream CMT form)'
    again, lines = _upgrade(upgraded, caplog)
    assert again is upgraded and not lines


@pytest.mark.parametrize('build, cfg, current', [
    (build_head, dict(type='CmtHead', in_channels=8, scalar=10), r'denoising=dict\(scalar=\.\.\.\)'),
    (build_head, dict(type='CmtHead', in_channels=8, enable_aqr=True),
     r'routing=dict\(aqr_config=\.\.\.\) \(AQR is on iff aqr_config is given\)'),
    (ATTENTION.build, dict(FLASH, use_flashbias=True), "prefer='flashbias'"),
    (MODELS.build, dict(type='AQRWeightGenerator', encoder_config=_encoder_config()),
     'embed_dims, num_heads, feedforward_channels, dropout'),
])
def test_runtime_classes_refuse_legacy_keys_naming_the_current_key_and_the_upgrade(build, cfg, current):
    with pytest.raises(LegacyKeyError, match=f'{current} instead .*{UPGRADE} rewrites it'):
        build(cfg)


@pytest.mark.parametrize('name', sorted(LEGACY_TYPES))
def test_legacy_registry_names_refuse_naming_the_current_type(name):
    build = build_transformer if 'Transformer' in name else build_head
    with pytest.raises(LegacyKeyError, match=f"type='{name}' is a legacy registry name; use "
                                             f'{re.escape(LEGACY_TYPES[name])} instead .*{UPGRADE} rewrites it'):
        build(dict(type=name))


def test_every_legacy_key_has_a_rule():
    from projects.mmdet3d_plugin.config_upgrade.upgrade import RULES
    assert set(LEGACY_KEYS) | set(LEGACY_TYPES) <= set(RULES)


def test_load_config_upgrades_the_model(caplog):
    from types import SimpleNamespace

    from projects.mmdet3d_plugin.mmcv_custom.launch import load_config
    args = SimpleNamespace(config='configs/design_notes/cmt_aqr_voxel0100_r50_800x320_cbgs.py', cfg_options=None,
                           local_rank=0, work_dir=None)
    with caplog.at_level(logging.INFO, logger='mmdet'):
        head = load_config(args).model.pts_bbox_head
    assert head.type == 'CmtHead' and 'enable_aqr' not in head and 'aqr_config' not in head
    assert head.routing.aqr_config.num_heads == 8 and 'encoder_config' not in head.routing.aqr_config
    assert 'config upgrade: model.pts_bbox_head.enable_aqr=True -> removed' in caplog.text


def test_the_routing_target_keys_are_current_keys(caplog):
    """``unmatched_loss_weight`` / ``lie_targets`` of the weight generator pass the upgrade untouched and build."""
    aqr = dict(type='AQRWeightGenerator', embed_dims=32, num_heads=4, window_sizes=[3, 3], query_loss_weight=1.0,
               unmatched_loss_weight=0.5, lie_targets=True)
    upgraded, lines = _upgrade(dict(type='CmtHead', routing=dict(aqr_config=aqr)), caplog)
    assert upgraded == dict(type='CmtHead', routing=dict(aqr_config=aqr)) and lines == []
    generator = MODELS.build(upgraded['routing']['aqr_config'])
    assert generator.unmatched_loss_weight == 0.5 and generator.lie_targets and generator.with_unmatched_targets
