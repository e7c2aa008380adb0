"""DisableObjectSampleHook: from ``disable_after_epoch`` on, no pipeline of the training set has GT sampling,
through the dataset wrappers, in data loader workers (persistent ones restarted), and in a resumed run.

The end-to-end check (two gloo processes training a tiny config, GT-sampled objects counted per epoch in every
rank and worker) is tests/tools/test_dist_train_object_sample.py.
"""
import argparse
import logging
from types import SimpleNamespace

import pytest
from mmcv import Config, DictAction
from mmcv.runner import EpochBasedRunner, IterBasedRunner
from mmdet3d.datasets.pipelines import ObjectSample
from torch import nn
from torch.utils.data import DataLoader, Dataset

from projects.mmdet3d_plugin.datasets.pipelines.object_sample import UnifiedObjectSample
from projects.mmdet3d_plugin.mmcv_custom.disable_object_sample import (DisableObjectSampleHook, dataset_pipelines,
                                                                        has_gt_sampling, remove_gt_sampling)
from projects.mmdet3d_plugin.utils.repo_paths import REPO_ROOT


def _transform(cls):
    """A GT-sampling transform without its database (only its type matters here)."""
    return object.__new__(cls)


class _Pipeline:
    """mmdet's ``Compose``: a ``transforms`` list."""

    def __init__(self, *transforms) -> None:
        self.transforms = list(transforms)


class _Dataset(Dataset):
    """Each item: how many GT-sampling transforms its pipeline has when the item is loaded."""

    def __init__(self, *transforms, length: int = 4) -> None:
        self.pipeline = _Pipeline(*transforms)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return sum(isinstance(t, (ObjectSample, UnifiedObjectSample)) for t in self.pipeline.transforms)


def _runner(epoch: int, data_loader) -> SimpleNamespace:
    return SimpleNamespace(epoch=epoch, data_loader=data_loader, logger=logging.getLogger('test_disable_sample'))


def test_removed_from_every_pipeline_through_the_wrappers():
    inner = [_Dataset('load', _transform(UnifiedObjectSample), 'flip'), _Dataset(_transform(ObjectSample), 'norm')]
    concat = SimpleNamespace(datasets=inner)
    wrapped = SimpleNamespace(dataset=SimpleNamespace(dataset=concat))  # CBGS(Repeat(Concat([a, b])))
    assert len(list(dataset_pipelines(wrapped))) == 2 and has_gt_sampling(wrapped)
    assert remove_gt_sampling(wrapped) == ['UnifiedObjectSample', 'ObjectSample']
    assert [p.transforms for p in dataset_pipelines(wrapped)] == [['load', 'flip'], ['norm']]
    assert not has_gt_sampling(wrapped) and remove_gt_sampling(wrapped) == []


def test_the_hook_switches_at_its_epoch_and_logs_once(caplog):
    dataset = _Dataset(_transform(UnifiedObjectSample))
    hook = DisableObjectSampleHook(disable_after_epoch=2)
    with caplog.at_level(logging.INFO):
        for epoch in range(2):
            hook.before_train_epoch(_runner(epoch, DataLoader(dataset)))
            assert has_gt_sampling(dataset), f'GT sampling removed before epoch {epoch + 1}'
        for epoch in (2, 3):
            hook.before_train_epoch(_runner(epoch, DataLoader(dataset)))
            assert not has_gt_sampling(dataset)
    switches = [r.message for r in caplog.records if 'GT sampling off' in r.message]
    assert switches == ['DisableObjectSampleHook: GT sampling off from epoch 3 on (disable_after_epoch=2): removed '
                        'UnifiedObjectSample from the training pipeline']


def test_a_run_resumed_after_the_switch_epoch_trains_without_gt_sampling():
    dataset = _Dataset(_transform(ObjectSample))
    DisableObjectSampleHook(disable_after_epoch=3).before_train_epoch(_runner(4, DataLoader(dataset)))
    assert not has_gt_sampling(dataset)


def test_none_keeps_gt_sampling():
    dataset = _Dataset(_transform(ObjectSample))
    hook = DisableObjectSampleHook(disable_after_epoch=None)
    for epoch in range(30):
        hook.before_train_epoch(_runner(epoch, DataLoader(dataset)))
    assert has_gt_sampling(dataset)


@pytest.mark.parametrize('persistent', [False, True])
def test_data_loader_workers_see_the_new_pipeline(persistent):
    dataset = _Dataset(_transform(UnifiedObjectSample))
    loader = DataLoader(dataset, batch_size=2, num_workers=1, persistent_workers=persistent)
    hook = DisableObjectSampleHook(disable_after_epoch=1)
    seen = []
    for epoch in range(3):
        hook.before_train_epoch(_runner(epoch, loader))
        seen.append(sum(int(batch.sum()) for batch in loader))
    assert seen == [4, 0, 0]  # a persistent worker not restarted would still sample in epochs 2 and 3


def test_a_pipeline_without_gt_sampling_is_named_in_a_warning(caplog):
    dataset = _Dataset(type('LoadPointsFromFile', (), {})(), type('PointShuffle', (), {})())
    with caplog.at_level(logging.WARNING):
        DisableObjectSampleHook(disable_after_epoch=0).before_train_epoch(_runner(0, DataLoader(dataset)))
    assert ("the training pipeline has no GT sampling (ObjectSample, UnifiedObjectSample) to turn off; its pipelines: "
            "[['LoadPointsFromFile', 'PointShuffle']]") in caplog.text


class _Model(nn.Linear):
    def train_step(self, data, optimizer):
        return {}


def test_an_iteration_based_runner_is_warned_about(caplog, tmp_path):
    with caplog.at_level(logging.WARNING):
        for runner_type in (IterBasedRunner, EpochBasedRunner):
            runner = runner_type(_Model(1, 1), work_dir=str(tmp_path), logger=logging.getLogger(runner_type.__name__))
            DisableObjectSampleHook(disable_after_epoch=1).before_run(runner)
    assert [record.getMessage() for record in caplog.records] == [
        'DisableObjectSampleHook counts epochs: under IterBasedRunner it does nothing, GT sampling stays on']


@pytest.mark.parametrize('bad', [-1, 1.5, True, '15'])
def test_a_bad_epoch_is_refused(bad):
    with pytest.raises(ValueError, match='disable_after_epoch must be an epoch count >= 0 or None'):
        DisableObjectSampleHook(disable_after_epoch=bad)


FIFTEEN_PLUS_FIVE = ('cmt_lidar_voxel0075_cbgs', 'cmt_voxel0100_r50_800x320_cbgs', 'cmt_voxel0075_vov_1600x640_cbgs',
                     'cmt_aqr_voxel0100_r50_800x320_cbgs', 'cmt_aqr_voxel0075_vov_1600x640_cbgs')


def _train_steps(cfg) -> list:
    train = cfg.data.train
    return [step['type'] for step in train.get('dataset', train).pipeline]


@pytest.mark.parametrize('name', FIFTEEN_PLUS_FIVE + ('cmt_camera_vov_1600x640_cbgs', ))
def test_the_published_configs_train_15e_with_gt_sampling_and_5e_without(name):
    cfg = Config.fromfile(f'{REPO_ROOT}/configs/{name}.py')
    assert cfg.runner.max_epochs == 20
    if name not in FIFTEEN_PLUS_FIVE:  # the camera config: 20e, no GT sampling
        assert 'custom_hooks' not in cfg and not {'ObjectSample', 'UnifiedObjectSample'} & set(_train_steps(cfg))
        return
    assert cfg.custom_hooks == [dict(type='DisableObjectSampleHook', disable_after_epoch=15)]
    assert {'ObjectSample', 'UnifiedObjectSample'} & set(_train_steps(cfg))  # epochs 1-15 keep GT sampling
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg.merge_from_dict(parser.parse_args(['--cfg-options', 'custom_hooks.0.disable_after_epoch=None']).cfg_options)
    assert DisableObjectSampleHook(**{k: v for k, v in cfg.custom_hooks[0].items() if k != 'type'}) \
        .disable_after_epoch is None
