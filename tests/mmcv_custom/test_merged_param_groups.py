"""MergedParamGroupsOptimizerConstructor: mmcv's parameter-wise options in one group per distinct set of options."""
import copy

import pytest
import torch
from mmcv import Config
from mmcv.runner import DefaultOptimizerConstructor, build_optimizer
from torch import nn

from projects.mmdet3d_plugin.mmcv_custom.merged_param_groups import (MergedParamGroupsOptimizerConstructor,
                                                                    merge_param_groups, regroup_optimizer_state)

#: CMT's paramwise options (configs/cmt_voxel0100_r50_800x320_cbgs.py) on the toy detector's module names
PARAMWISE = dict(custom_keys={'img_backbone': dict(lr_mult=0.01, decay_mult=5), 'img_neck': dict(lr_mult=0.1)})
ADAMW = dict(type='AdamW', lr=1e-3, weight_decay=0.01)


class _Detector(nn.Module):
    """Parameters in the order a detector has them: options alternate between groups along the model."""

    def __init__(self) -> None:
        super().__init__()
        self.img_backbone = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
        self.img_neck = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.img_backbone_extra = nn.Linear(4, 2, bias=False)  # the backbone's options again, after the head
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        neck = self.img_neck(self.img_backbone(x))
        return (self.head(neck).square().sum() + self.img_backbone_extra(neck).sum() +
                self.frozen(self.head(neck)).sum())


def _options_by_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Every parameter's optimizer options, by the parameter's name in ``model``."""
    names = {id(param): name for name, param in model.named_parameters()}
    return {names[id(param)]: {key: value for key, value in group.items() if key != 'params'}
            for group in optimizer.param_groups for param in group['params']}


def _trained(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 3, generator=generator)).backward()
        optimizer.step()


def test_one_group_per_distinct_options_with_every_parameter_and_its_options():
    models = [_Detector(), _Detector()]
    default = DefaultOptimizerConstructor(ADAMW, PARAMWISE)(models[0])
    merged = MergedParamGroupsOptimizerConstructor(ADAMW, PARAMWISE)(models[1])
    assert len(default.param_groups) == len(list(models[0].parameters())) == 11
    # backbone (lr x0.01, decay x5), neck (lr x0.1), the rest (base options; the frozen parameters too)
    assert len(merged.param_groups) == 3
    assert _options_by_name(models[1], merged) == _options_by_name(models[0], default)
    assert sorted(group['lr'] for group in merged.param_groups) == pytest.approx([1e-5, 1e-4, 1e-3])


def test_merge_keeps_the_model_order_and_numbers_the_parameters_as_the_state_dict_does():
    a, b, c, d, e = (nn.Parameter(torch.zeros(1)) for _ in range(5))
    groups = [dict(params=[a], lr=1.0), dict(params=[b], lr=2.0), dict(params=[c, d], lr=1.0), dict(params=[e], lr=2.0)]
    merged, new_position = merge_param_groups(groups)
    assert [[id(p) for p in group['params']] for group in merged] == [[id(a), id(c), id(d)], [id(b), id(e)]]
    assert [group['lr'] for group in merged] == [1.0, 2.0]
    assert new_position == [0, 3, 1, 2, 4]


@pytest.mark.parametrize('optimizer', [dict(), dict(foreach=True), dict(type='SGD', lr=0.1, momentum=0.9,
                                                                         weight_decay=1e-3)])
def test_training_with_merged_groups_gives_bit_identical_parameters(optimizer):
    torch.manual_seed(0)
    models = [_Detector(), None]
    models[1] = copy.deepcopy(models[0])
    cfg = dict(ADAMW, **optimizer)
    optimizers = [DefaultOptimizerConstructor(cfg, PARAMWISE)(models[0]),
                  MergedParamGroupsOptimizerConstructor(cfg, PARAMWISE)(models[1])]
    assert len(optimizers[1].param_groups) < len(optimizers[0].param_groups)
    for model, opt in zip(models, optimizers):
        _trained(model, opt, steps=4)
    for (name, before), after in zip(models[0].state_dict().items(), models[1].state_dict().values()):
        assert torch.equal(before, after), name
    assert not torch.equal(models[0].img_backbone[0].weight, _Detector().img_backbone[0].weight)


def test_a_checkpoint_with_per_parameter_groups_resumes_into_merged_groups():
    """The old layout's state (moments, step counts, the scheduled lr) continues as if never merged."""
    torch.manual_seed(0)
    model = _Detector()
    reference = copy.deepcopy(model)
    per_parameter = DefaultOptimizerConstructor(ADAMW, PARAMWISE)(reference)
    _trained(reference, per_parameter, steps=3)
    for group in per_parameter.param_groups:  # a schedule changed the learning rates before the checkpoint
        group['initial_lr'] = group['lr']
        group['lr'] *= 0.5
    saved_model, saved_optimizer = copy.deepcopy(reference.state_dict()), copy.deepcopy(per_parameter.state_dict())

    model.load_state_dict(saved_model)
    merged = MergedParamGroupsOptimizerConstructor(ADAMW, PARAMWISE)(model)
    merged.load_state_dict(saved_optimizer)
    assert len(merged.param_groups) == 3
    assert sorted(group['lr'] for group in merged.param_groups) == pytest.approx([5e-6, 5e-5, 5e-4])
    assert all('initial_lr' in group for group in merged.param_groups)
    _trained(reference, per_parameter, steps=2, seed=1)
    _trained(model, merged, steps=2, seed=1)
    for (name, expected), actual in zip(reference.state_dict().items(), model.state_dict().values()):
        assert torch.equal(expected, actual), name
    # and the merged layout's own state dict loads back as it is
    again = MergedParamGroupsOptimizerConstructor(ADAMW, PARAMWISE)(copy.deepcopy(model))
    again.load_state_dict(merged.state_dict())
    assert [len(group['params']) for group in again.param_groups] == [len(g['params']) for g in merged.param_groups]


def test_regrouping_refuses_parameters_saved_with_different_options_or_another_model():
    model = _Detector()
    saved = DefaultOptimizerConstructor(ADAMW, PARAMWISE)(copy.deepcopy(model)).state_dict()
    saved['param_groups'][1]['lr'] = 123.0  # the backbone's LayerNorm weight, merged with its Linear
    merged = MergedParamGroupsOptimizerConstructor(ADAMW, PARAMWISE)(model)
    with pytest.raises(ValueError, match='share an optimizer group now but were saved with different options'):
        merged.load_state_dict(saved)
    saved['param_groups'] = saved['param_groups'][:-1]
    with pytest.raises(ValueError, match='holds 10 parameters, the optimizer 11'):
        regroup_optimizer_state(saved, [0] * 11, [11])


def test_a_state_merged_with_other_options_is_refused_not_renumbered():
    """Saved with a neck of its own options (4 merged groups), loaded where the neck shares the base options (3):
    the saved numbering is not mmcv's per-parameter one, so it must not be regrouped as if it were."""
    other = dict(custom_keys=dict(PARAMWISE['custom_keys'], head=dict(lr_mult=0.5)))
    saved = MergedParamGroupsOptimizerConstructor(ADAMW, other)(_Detector()).state_dict()
    assert len(saved['param_groups']) == 4
    with pytest.raises(ValueError, match='different number of parameter groups'):
        MergedParamGroupsOptimizerConstructor(ADAMW, PARAMWISE)(_Detector()).load_state_dict(saved)


def test_without_paramwise_options_it_builds_what_mmcv_builds():
    model = _Detector()
    optimizer = MergedParamGroupsOptimizerConstructor(ADAMW)(model)
    assert len(optimizer.param_groups) == 1 and len(optimizer.param_groups[0]['params']) == 11


@pytest.mark.parametrize('config', ['cmt_voxel0100_r50_800x320_cbgs', 'cmt_aqr_voxel0100_r50_800x320_cbgs',
                                    'cmt_voxel0075_vov_1600x640_cbgs', 'cmt_camera_vov_1600x640_cbgs'])
def test_cmt_configs_build_it_through_mmcv(config):
    """The configs' schedule names the constructor; their paramwise options give three groups through mmcv."""
    cfg = Config.fromfile(f'configs/{config}.py')
    assert cfg.optimizer.constructor == 'MergedParamGroupsOptimizerConstructor'
    model = _Detector()
    optimizer = build_optimizer(model, cfg.optimizer)
    assert len(optimizer.param_groups) == 3
    expected = DefaultOptimizerConstructor({k: v for k, v in cfg.optimizer.items() if k not in ('constructor',
                                                                                                   'paramwise_cfg')},
                                           cfg.optimizer.paramwise_cfg)(model)
    assert _options_by_name(model, optimizer) == _options_by_name(model, expected)
