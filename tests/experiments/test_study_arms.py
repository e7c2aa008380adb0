"""experiments/study_arms.py: the arms in table order, their configs and what the study changes in them."""
import os.path as osp

import pytest
from mmcv import Config
from mmdet3d.datasets.pipelines import Compose
from mmdet3d.models import build_model

from projects.mmdet3d_plugin.experiments.study_arms import (FINETUNE_TEST_CORRUPTIONS, STAGE2_CORRUPTIONS, STUDY_ARMS,
                                                            STUDY_DESIGNS, StudyArm, arm_config, checkpoint_arm,
                                                            set_modality_drop, study_arm)
from projects.mmdet3d_plugin.datasets.corruption_config import add_train_corruptions

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _types(cfg):
    return [step['type'] for step in cfg.data.train.pipeline]


def test_arms_in_table_order_with_their_training_and_routing():
    assert [arm.name for arm in STUDY_ARMS] == ['lidar_only', 'camera_only', 'stage1', 'control', 'global_gate',
                                                'aqr_targets', 'oracle']
    assert [arm.training for arm in STUDY_ARMS] == ['stage1'] * 3 + ['stage2'] * 3 + ['none']
    assert [arm.test_routing for arm in STUDY_ARMS] == ['learned'] * 6 + ['oracle']
    assert [arm.modality_drop for arm in STUDY_ARMS] == [(1.0, 0.0), 'none'] + ['study'] * 5
    assert (study_arm('lidar_only').config == study_arm('control').config == study_arm('stage1').config
            == 'configs/demo/cmt_aqr_synthetic_tiny_passes_fixed_routing.py')
    assert not study_arm('oracle').is_trained and study_arm('aqr_targets').is_trained
    # the oracle evaluates the final router's checkpoint with its config
    assert checkpoint_arm(study_arm('oracle')) == study_arm('aqr_targets')
    assert study_arm('oracle').config == study_arm('aqr_targets').config
    assert checkpoint_arm(study_arm('control')) == study_arm('control')
    for arm in STUDY_ARMS:
        assert osp.exists(osp.join(REPO_ROOT, arm.config)), arm.config
    with pytest.raises(ValueError, match="no study arm 'mome'"):
        study_arm('mome')
    with pytest.raises(ValueError, match='training must be one of'):
        StudyArm('x', 'x', 'x', 'x.py', 'stage3')
    with pytest.raises(ValueError, match='exactly when it trains none of its own'):
        StudyArm('x', 'x', 'x', 'x.py', 'none')
    with pytest.raises(ValueError, match='exactly when it trains none of its own'):
        StudyArm('x', 'x', 'x', 'x.py', 'stage2', evaluates='stage1')
    with pytest.raises(ValueError, match='modality_drop must be'):
        StudyArm('x', 'x', 'x', 'x.py', 'stage2', modality_drop='config')


def test_every_arm_is_the_camera_pass_detector_but_the_camera_only_model():
    for arm in STUDY_ARMS:
        head = Config.fromfile(osp.join(REPO_ROOT, arm.config)).model.pts_bbox_head
        if arm.name == 'camera_only':
            assert head.type == 'CmtImageHead'
        else:
            assert tuple(head.modality_passes) == ('fused', 'camera') and head.lidar_free_pass == 'camera'


@pytest.mark.parametrize('name, generator', [
    ('global_gate', dict(granularity='sample', aux_loss_weight=1.0, query_loss_weight=0.0)),
    ('aqr_targets', dict(granularity='query', aux_loss_weight=0.0, query_loss_weight=1.0))])
def test_routing_arms_build_their_router_and_train_every_parameter(name, generator):
    cfg = Config.fromfile(osp.join(REPO_ROOT, study_arm(name).config))
    assert not cfg.get('custom_hooks')  # nothing frozen: detector and router train together, as the control
    router = build_model(cfg.model).pts_bbox_head.aqr_weight_generator
    assert {key: getattr(router, key) for key in generator} == generator


def test_every_stage2_arm_trains_with_the_same_corruptions_and_only_the_control_keeps_routing_off():
    stage2 = [arm for arm in STUDY_ARMS if arm.training == 'stage2']
    assert [arm.name for arm in stage2] == ['control', 'global_gate', 'aqr_targets']
    assert all(arm.train_corruptions == STAGE2_CORRUPTIONS for arm in stage2)
    assert not any(arm.train_corruptions for arm in STUDY_ARMS if arm.training != 'stage2')
    (hook, ) = Config.fromfile(osp.join(REPO_ROOT, study_arm('control').config)).custom_hooks
    assert hook.type == 'FreezeParametersHook'
    assert hook.frozen == ['pts_bbox_head.aqr_weight_generator', 'pts_bbox_head.attention_bias_generator']


def test_arm_config_sets_data_epochs_modality_drop_and_the_targets_corruptions(tmp_path):
    cfg = arm_config(study_arm('aqr_targets'), str(tmp_path), 3, 0.1, 0.4, load_from='stage1.pth',
                     repo_root=REPO_ROOT)
    assert (cfg.runner.max_epochs, cfg.load_from, cfg.checkpoint_config.max_keep_ckpts) == (3, 'stage1.pth', 1)
    assert cfg.data.train.data_root.rstrip('/') == str(tmp_path)
    (mask, ) = [step for step in cfg.data.train.pipeline if step['type'] == 'ModalMask3D']
    assert (mask['image_drop_prob'], mask['points_drop_prob']) == (0.1, 0.4)
    types = _types(cfg)
    # after loading and GT sampling (the pasted objects are corrupted too), before ModalMask3D and augmentation
    assert types[types.index('UnifiedObjectSample'):types.index('GlobalRotScaleTransAll')] == [
        'UnifiedObjectSample', 'RandomSensorCorruption', 'ModalMask3D']
    step = cfg.data.train.pipeline[types.index('RandomSensorCorruption')]
    assert step['corruptions'] == [dict(item) for item in STAGE2_CORRUPTIONS]
    assert step['sweep_time_column'] == 4  # the demo's sweeps write their time lag in column 4
    transform = Compose([step]).transforms[0]
    assert [t.name for t in transform.transforms] == ['object_drop:0.5', 'camera_fail:0.4', 'mixed:120',
                                                      'camera_drop']
    assert transform.thresholds.tolist() == pytest.approx([0.15, 0.3, 0.45, 0.6])
    other = arm_config(study_arm('stage1'), str(tmp_path), 12, 0.25, 0.25, repo_root=REPO_ROOT)
    assert 'RandomSensorCorruption' not in _types(other) and other.load_from is None


def test_single_sensor_arms_keep_their_own_modality_drop(tmp_path):
    lidar = arm_config(study_arm('lidar_only'), str(tmp_path), 12, 0.25, 0.25, repo_root=REPO_ROOT)
    (mask, ) = [step for step in lidar.data.train.pipeline if step['type'] == 'ModalMask3D']
    assert (mask['image_drop_prob'], mask['points_drop_prob']) == (1.0, 0.0)
    camera = arm_config(study_arm('camera_only'), str(tmp_path), 12, 0.25, 0.25, repo_root=REPO_ROOT)
    assert 'ModalMask3D' not in _types(camera) and camera.runner.max_epochs == 12


def test_bad_pipelines_and_specs_are_refused():
    cfg = Config.fromfile(osp.join(REPO_ROOT, study_arm('stage1').config))
    with pytest.raises(ValueError, match='unknown corruption mode'):
        add_train_corruptions(cfg, [dict(spec='fog:0.5', prob=0.2)])
    cfg.data.train.pipeline = [step for step in cfg.data.train.pipeline if step['type'] != 'ModalMask3D']
    with pytest.raises(ValueError, match='no ModalMask3D step: the study'):
        set_modality_drop(cfg, 0.1, 0.4)
    with pytest.raises(ValueError, match='no ModalMask3D step to put the corruptions before'):
        add_train_corruptions(cfg, STAGE2_CORRUPTIONS)


def test_the_finetune_design_runs_the_published_recipe_with_and_without_routing(tmp_path):
    design = STUDY_DESIGNS['finetune']
    assert [arm.name for arm in design.arms] == ['stage1', 'control', 'aqr_finetune']
    assert design.arms[0] == study_arm('stage1') and design.corruptions == FINETUNE_TEST_CORRUPTIONS
    assert not design.stage2_corruptions and not any(arm.train_corruptions for arm in design.arms)
    control, routed = (arm_config(study_arm(name, design.arms), str(tmp_path), 1, 0.0, 0.0, load_from='stage1.pth',
                                  repo_root=REPO_ROOT) for name in ('control', 'aqr_finetune'))
    assert control.load_from == routed.load_from == 'stage1.pth' and control.runner.max_epochs == 1
    assert control.optimizer.lr == routed.optimizer.lr == 1.4e-3 / 40 and control.lr_config == routed.lr_config
    assert 'UnifiedObjectSample' in _types(control)  # removed from the first epoch on by the hook
    assert control.custom_hooks[0] == routed.custom_hooks[0] == dict(type='DisableObjectSampleHook',
                                                                     disable_after_epoch=0)
    assert [hook['type'] for hook in control.custom_hooks[1:]] == ['FreezeParametersHook'] and \
        len(routed.custom_hooks) == 1
    assert routed.optimizer.paramwise_cfg.custom_keys == {'aqr_weight_generator': dict(lr_mult=10.0),
                                                          'attention_bias_generator': dict(lr_mult=10.0)}
    routed.model.pts_bbox_head.aqr_config.query_loss_weight = 1.0  # the published recipe has no routing targets
    assert routed.model == control.model
