"""FreezeParametersHook: only the named modules train; the others keep their weights and BatchNorm statistics."""
import logging
from types import SimpleNamespace

import pytest
import torch
from mmcv import Config
from mmcv.parallel import MMDataParallel
from mmcv.runner import HOOKS, build_optimizer
from torch import nn

from projects.mmdet3d_plugin.mmcv_custom.freeze_parameters import (FreezeParametersHook, freeze_parameters,
                                                                   frozen_norm_layers)


class _Detector(nn.Module):
    """A backbone with a BatchNorm and a head with a router, as named in a detector."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
        self.head = nn.ModuleDict(dict(router=nn.Linear(8, 2), router_extra=nn.Linear(8, 2), cls=nn.Linear(8, 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feature = self.backbone(x)
        return sum(layer(feature).sum() for layer in self.head.values())


def _runner(model: nn.Module) -> SimpleNamespace:
    return SimpleNamespace(model=model, logger=logging.getLogger('test_freeze_parameters'))


def _state(model: nn.Module) -> dict:
    return {name: value.clone() for name, value in model.state_dict().items()}


@pytest.mark.parametrize('wrap', [False, True])
def test_a_training_step_changes_only_the_trainable_module(wrap):
    torch.manual_seed(0)
    detector = _Detector()
    model = MMDataParallel(detector, device_ids=None) if wrap else detector
    optimizer = build_optimizer(model, dict(type='AdamW', lr=0.1, weight_decay=0.1))  # built before the hook runs
    hook = FreezeParametersHook(trainable=['head.router'])
    runner = _runner(model)
    before = _state(detector)
    hook.before_run(runner)
    model.train()
    hook.before_train_epoch(runner)
    for _ in range(2):
        optimizer.zero_grad()
        detector(torch.randn(16, 4)).backward()
        optimizer.step()
    after = detector.state_dict()
    changed = sorted(name for name in before if not torch.equal(before[name], after[name]))
    # 'head.router_extra' only shares the prefix text, not the module: frozen
    assert changed == ['head.router.bias', 'head.router.weight']
    assert not detector.backbone[1].training  # running_mean / running_var / num_batches_tracked untouched
    assert detector.head.training


def test_freeze_parameters_returns_both_sets_and_refuses_an_unknown_module():
    detector = _Detector()
    kept, frozen = freeze_parameters(detector, ['head.router', 'head.cls.bias'])
    assert kept == ['head.router.weight', 'head.router.bias', 'head.cls.bias']
    assert len(kept) + len(frozen) == len(list(detector.parameters()))
    assert [p.requires_grad for p in detector.parameters()].count(True) == 3
    assert frozen_norm_layers(detector) == [detector.backbone[1]]
    with pytest.raises(ValueError, match='no parameter under'):
        freeze_parameters(_Detector(), ['head.routr'])
    with pytest.raises(ValueError, match='at least one'):
        FreezeParametersHook(trainable=[])


def test_frozen_names_the_modules_to_freeze_and_exactly_one_selection_is_given():
    detector = _Detector()
    kept, frozen = freeze_parameters(detector, frozen=['head.router'])
    assert frozen == ['head.router.weight', 'head.router.bias']
    assert 'head.router_extra.weight' in kept and 'backbone.0.weight' in kept
    assert frozen_norm_layers(detector) == []  # the backbone's BatchNorm still trains
    with pytest.raises(ValueError, match='exactly one'):
        FreezeParametersHook(trainable=['head.router'], frozen=['head.cls'])
    with pytest.raises(ValueError, match='exactly one'):
        FreezeParametersHook()
    with pytest.raises(ValueError, match='no parameter under'):
        freeze_parameters(_Detector(), frozen=['head.routr'])


def test_stage2_demo_config_trains_exactly_the_aqr_modules():
    from mmdet3d.models import build_model
    cfg = Config.fromfile('configs/demo/cmt_aqr_synthetic_tiny_stage2.py')  # imports the hook (custom_imports)
    detector = build_model(cfg.model)
    (hook_cfg, ) = cfg.custom_hooks
    hook = HOOKS.build(hook_cfg)
    hook.before_run(_runner(detector))
    trainable = {name.split('.')[1] for name, p in detector.named_parameters() if p.requires_grad}
    assert trainable == {'aqr_weight_generator', 'attention_bias_generator'}
    assert any(name.endswith('bias_scale') for name, p in detector.named_parameters() if p.requires_grad)  # alpha


def test_fixed_routing_demo_config_trains_everything_but_the_aqr_modules():
    from mmdet3d.models import build_model
    cfg = Config.fromfile('configs/demo/cmt_aqr_synthetic_tiny_fixed_routing.py')
    detector = build_model(cfg.model)
    (hook_cfg, ) = cfg.custom_hooks
    HOOKS.build(hook_cfg).before_run(_runner(detector))
    aqr_prefixes = ('pts_bbox_head.aqr_weight_generator.', 'pts_bbox_head.attention_bias_generator.')
    assert any(name.endswith('bias_scale') for name, _ in detector.named_parameters())  # alpha stays fixed too
    assert all(p.requires_grad != name.startswith(aqr_prefixes) for name, p in detector.named_parameters())
