"""configs/finetune/: CMT-AQR from a trained CMT and its baseline twin, fine-tuned identically.

Each pair differs by AQR only (the AQR dicts of the published CMT-AQR config and the AQR parameters' learning-rate
multiplier); both load a CMT checkpoint (``load_from``: where the published CMT config's training writes it), train
1 epoch without GT sampling at a fine-tuning learning rate; ``*_router_only.py`` trains the router and alpha only.
The bias-strength sweep of the design notes is one ``--cfg-options`` away.
"""
import argparse
import copy
import os.path as osp

import pytest
from mmcv import Config, DictAction

from projects.mmdet3d_plugin.utils.repo_paths import REPO_ROOT

BACKBONES = ('voxel0100_r50_800x320', 'voxel0075_vov_1600x640')
AQR_MODULES = ['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator']


def _config(path: str, options=()) -> Config:
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', path))
    if options:
        parser = argparse.ArgumentParser()
        parser.add_argument('--cfg-options', nargs='+', action=DictAction)
        cfg.merge_from_dict(parser.parse_args(['--cfg-options', *options]).cfg_options)
    return cfg


@pytest.mark.parametrize('backbone', BACKBONES)
def test_the_pair_differs_by_aqr_only_and_fine_tunes_one_epoch_from_the_cmt_checkpoint(backbone):
    baseline = _config(f'finetune/cmt_{backbone}_finetune_1e.py')
    aqr = _config(f'finetune/cmt_aqr_{backbone}_finetune_1e.py')
    published_cmt, published_aqr = _config(f'cmt_{backbone}_cbgs.py'), _config(f'cmt_aqr_{backbone}_cbgs.py')
    assert baseline.load_from == aqr.load_from == f'work_dirs/cmt_{backbone}_cbgs/latest.pth'
    assert baseline.model == published_cmt.model and aqr.model == published_aqr.model
    assert baseline.runner.max_epochs == 1 and baseline.optimizer.lr == 2e-5 < published_cmt.optimizer.lr
    assert baseline.lr_config.policy == 'CosineAnnealing' and baseline.lr_config.by_epoch is False
    assert baseline.momentum_config is None
    assert baseline.custom_hooks == [dict(type='DisableObjectSampleHook', disable_after_epoch=0)]
    without_aqr = copy.deepcopy(aqr._cfg_dict.to_dict())
    for key in ('aqr_config', 'attention_bias_config'):
        without_aqr['model']['pts_bbox_head'].pop(key)
    for key in ('aqr_weight_generator', 'attention_bias_generator'):
        assert without_aqr['optimizer']['paramwise_cfg']['custom_keys'].pop(key) == dict(lr_mult=10.0)
    assert without_aqr == baseline._cfg_dict.to_dict()


@pytest.mark.parametrize('backbone', BACKBONES)
def test_router_only_trains_the_router_and_alpha(backbone):
    cfg = _config(f'finetune/cmt_aqr_{backbone}_finetune_1e_router_only.py')
    assert cfg.custom_hooks == [dict(type='DisableObjectSampleHook', disable_after_epoch=0),
                                dict(type='FreezeParametersHook', trainable=AQR_MODULES)]
    everything = _config(f'finetune/cmt_aqr_{backbone}_finetune_1e.py')
    assert cfg.model == everything.model and cfg.load_from == everything.load_from


@pytest.mark.parametrize('strength', [3, 5, 7])
def test_the_bias_strength_sweep_is_one_cfg_option(strength):
    from mmdet3d.models import build_model

    import projects.mmdet3d_plugin  # noqa: F401
    cfg = _config('finetune/cmt_aqr_voxel0100_r50_800x320_finetune_1e.py',
                  [f'model.pts_bbox_head.attention_bias_config.bias_scale={strength}'])
    head = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg')).pts_bbox_head
    alpha = head.attention_bias_generator.bias_scale
    assert alpha.tolist() == [float(strength)] * alpha.numel()
