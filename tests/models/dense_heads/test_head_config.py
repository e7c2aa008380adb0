"""config_upgrade.upgrade_head_config: upstream CMT's flat head options, the CMT -> CMT-AQR recipe and the legacy
registry names become CmtHead's sub-configs."""
import copy
import inspect
import logging

import pytest
import torch
from mmdet.models.builder import build_head

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.config_upgrade import LegacyKeyError
from projects.mmdet3d_plugin.config_upgrade.head import upgrade_head_config
from projects.mmdet3d_plugin.models.dense_heads import CmtHead
from test_cmt_head import head_cfg

MAX_HEAD_ARGUMENTS = 15
AQR = dict(aqr_config=dict(type='AQRWeightGenerator', window_sizes=[3, 3]),
           attention_bias_config=dict(type='AttentionBiasGenerator', window_size=3, bias_scale=2.0))
UPSTREAM = dict(type='CmtHead', in_channels=512, hidden_dim=256, num_query=900, depth_num=64, downsample_scale=8,
                norm_bbox=True, scalar=10, noise_scale=1.0, noise_trans=0.0, dn_weight=1.0, split=0.75,
                common_heads=dict(center=(2, 2)), tasks=[dict(num_class=1, class_names=['car'])],
                separate_head=dict(type='SeparateTaskHead', init_bias=-2.19, final_kernel=3),
                transformer=dict(type='CmtTransformer'), bbox_coder=dict(type='MultiTaskBBoxCoder'),
                loss_cls=dict(type='FocalLoss'), loss_bbox=dict(type='L1Loss'), loss_heatmap=None, init_cfg=None,
                train_cfg=None, test_cfg=None)


def test_upstream_flat_keys_are_grouped_into_the_sub_configs():
    upgraded = upgrade_head_config(UPSTREAM)
    assert set(upgraded) == {'type', 'in_channels', 'hidden_dim', 'num_query', 'depth_num', 'downsample_scale',
                             'transformer', 'bbox_coder', 'train_cfg', 'test_cfg', 'task_heads', 'losses',
                             'denoising'}
    assert upgraded['type'] == 'CmtHead'
    assert upgraded['denoising'] == dict(scalar=10, noise_scale=1.0, noise_trans=0.0, split=0.75, dn_weight=1.0)
    assert upgraded['task_heads'] == dict(tasks=UPSTREAM['tasks'], common_heads=UPSTREAM['common_heads'],
                                          separate_head=UPSTREAM['separate_head'])
    assert upgraded['losses'] == dict(loss_cls=UPSTREAM['loss_cls'], loss_bbox=UPSTREAM['loss_bbox'])
    assert upgrade_head_config(upgraded) == upgraded, 'the grouped form is its own upgrade'
    assert UPSTREAM['type'] == 'CmtHead' and 'scalar' in UPSTREAM, 'the given config is not changed'


def test_the_aqr_recipe_and_the_options_of_this_repository_move_into_their_parts():
    options = dict(modality_passes=('fused', 'camera'), pass_decoders='separate', lidar_free_pass='camera',
                   image_aux_config=dict(type='ImageAuxHead'), camera_depth_position=True,
                   camera_window_prior=dict(window_size=5, bias=4.0), fused_image_drop_prob=0.25)
    upgraded = upgrade_head_config(dict(UPSTREAM, **AQR, **options))
    assert upgraded['routing'] == AQR
    assert upgraded['passes'] == dict(modality_passes=('fused', 'camera'), pass_decoders='separate',
                                      lidar_free_pass='camera')
    assert upgraded['aids'] == dict(image_aux_config=dict(type='ImageAuxHead'), camera_depth_position=True,
                                    camera_window_prior=dict(window_size=5, bias=4.0), fused_image_drop_prob=0.25)


def test_flat_grouped_and_legacy_names_build_the_same_head():
    torch.manual_seed(0)
    flat = head_cfg(modality_passes=('fused', 'lidar'), **AQR)
    grouped_cfg = upgrade_head_config(dict(type='CmtHead', modality_passes=('fused', 'lidar'), **AQR))
    assert grouped_cfg['routing'] == AQR
    lidar_only = head_cfg('CmtLidarHead', 'CmtLidarTransformer')
    assert type(flat) is type(lidar_only) is CmtHead
    by_passes = head_cfg(passes=dict(modalities=('lidar', )))
    assert [(k, v.shape) for k, v in by_passes.state_dict().items()] == \
        [(k, v.shape) for k, v in lidar_only.state_dict().items()], 'CmtLidarHead is CmtHead with BEV tokens only'
    assert not hasattr(head_cfg('CmtImageHead', 'CmtImageTransformer'), 'shared_conv')


def test_old_only_options_warn_or_raise_with_their_names(caplog):
    with pytest.warns(UserWarning, match='loss_heatmap is accepted for upstream CMT configs'):
        upgrade_head_config(dict(UPSTREAM, loss_heatmap=dict(type='GaussianFocalLoss')))
    with caplog.at_level(logging.INFO, logger='mmdet'):
        upgraded = upgrade_head_config(dict(UPSTREAM, enable_aqr=False, **AQR))
    assert upgraded['routing'] == {}
    assert 'enable_aqr=False -> removed, plain CMT; not built: aqr_config, attention_bias_config' in caplog.text
    assert upgrade_head_config(dict(UPSTREAM, enable_aqr=True, **AQR))['routing'] == AQR
    for options, message in (
            (dict(norm_bbox=False), 'norm_bbox=False is not supported'),
            (dict(init_cfg=dict(type='Kaiming')), 'init_cfg must be None'),
            (dict(enable_aqr=True), 'enable_aqr=True needs aqr_config'),
            (dict(enable_aqr='yes'), 'enable_aqr must be True, False or None'),
            (dict(aqr_bias_strength=2.0), r'aqr_bias_strength is a legacy key; use routing=dict\(attention_bias'),
            (dict(type='CmtRadarHead'), "unknown CMT head type 'CmtRadarHead'"),
            (dict(scalar=5, denoising=dict(scalar=10)),
             r'pts_bbox_head.scalar and pts_bbox_head.denoising.scalar are both given, with different values'),
            (dict(type='CmtLidarHead', passes=dict(modalities=('camera', ))), 'contradicts it'),
    ):
        with pytest.raises(ValueError, match=message):
            upgrade_head_config(dict(UPSTREAM, **options))


def test_a_key_given_flat_and_grouped_alike_is_one_key():
    """What ``--cfg-options model.pts_bbox_head.<flat key>=...`` makes of a config dumped after the upgrade (the demo's
    test step re-applies its training's options to the training's dumped config)."""
    dumped = upgrade_head_config(dict(UPSTREAM, scalar=5, **AQR))
    assert dumped['denoising']['scalar'] == 5
    assert upgrade_head_config(dict(dumped, scalar=5)) == dumped
    option = 'window_sizes'
    assert upgrade_head_config(dict(dumped, aqr_config={option: AQR['aqr_config'][option]})) == dumped, \
        'a dict option given flat merges into the grouped dict'
    with pytest.raises(ValueError, match=rf'give it once, as pts_bbox_head.routing.aqr_config.{option}'):
        upgrade_head_config(dict(dumped, aqr_config={option: 'another'}))


def test_the_earlier_aids_groups_of_dumped_configs_become_aids(caplog):
    """Configs dumped by earlier runs group the aids as ``camera_aids`` and ``lidar_aids``: both land in ``aids``,
    with one log line each; a key given there and in ``aids`` alike is one key, differently an error."""
    camera = dict(image_aux_config=dict(type='ImageAuxHead'), camera_depth_position=True)
    bev = dict(bev_aux_config=dict(type='BevAuxHead', detach_input=True))
    with caplog.at_level(logging.INFO, logger='mmdet'):
        upgraded = upgrade_head_config(dict(type='CmtHead', camera_aids=camera, lidar_aids=bev))
    assert upgraded == dict(type='CmtHead', aids=dict(camera, **bev))
    assert 'config upgrade: pts_bbox_head.camera_aids.* -> pts_bbox_head.aids.*' in caplog.text
    assert 'config upgrade: pts_bbox_head.lidar_aids.* -> pts_bbox_head.aids.*' in caplog.text
    assert upgrade_head_config(dict(upgraded, lidar_aids=bev)) == upgraded
    with pytest.raises(ValueError, match=r'give it once, as pts_bbox_head.aids.bev_aux_config.detach_input'):
        upgrade_head_config(dict(upgraded, lidar_aids=dict(bev_aux_config=dict(detach_input=False))))
    with pytest.raises(LegacyKeyError, match=r'CmtHead.camera_aids is a legacy key; use aids=dict\(\.\.\.\)'):
        build_head(dict(type='CmtHead', in_channels=8, camera_aids=camera))


def test_the_head_takes_at_most_15_arguments():
    """The head's options stay grouped into sub-configs: at most 15 arguments (``self`` aside)."""
    arguments = inspect.signature(CmtHead.__init__).parameters
    assert len(arguments) - 1 <= MAX_HEAD_ARGUMENTS, list(arguments)


def test_unknown_keys_reach_the_head_and_are_refused():
    with pytest.raises(TypeError, match='not_an_option'):
        head_cfg(not_an_option=1)
    cfg = copy.deepcopy(UPSTREAM)
    cfg.pop('norm_bbox')
    assert 'norm_bbox' not in upgrade_head_config(cfg)
    with pytest.raises(TypeError):
        build_head(dict(type='CmtHead', in_channels=8, transformer=dict(), bbox_coder=dict(), unknown=1))
