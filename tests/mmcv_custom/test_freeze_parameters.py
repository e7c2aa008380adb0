"""FreezeParametersHook: only the named modules train; the others keep their weights and BatchNorm statistics."""
import logging
from types import SimpleNamespace

import pytest
import torch
from mmcv import Config
from mmcv.parallel import MMDataParallel
from mmcv.runner import HOOKS, build_optimizer, build_runner
from torch import nn
from torch.utils.data import DataLoader

from projects.mmdet3d_plugin.mmcv_custom.freeze_parameters import (FreezeParametersHook, freeze_before_wrapping,
                                                                   freeze_parameters, frozen_norm_layers)


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
    assert frozen_norm_layers(detector, ['head.router', 'head.cls.bias']) == [detector.backbone[1]]
    with pytest.raises(ValueError, match='no parameter under'):
        freeze_parameters(_Detector(), ['head.routr'])
    with pytest.raises(ValueError, match='at least one'):
        FreezeParametersHook(trainable=[])


def test_frozen_names_the_modules_to_freeze_and_exactly_one_selection_is_given():
    detector = _Detector()
    kept, frozen = freeze_parameters(detector, frozen=['head.router'])
    assert frozen == ['head.router.weight', 'head.router.bias']
    assert 'head.router_extra.weight' in kept and 'backbone.0.weight' in kept
    assert frozen_norm_layers(detector, frozen=['head.router']) == []  # the backbone's BatchNorm still trains
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
    torch.manual_seed(0)
    cfg = Config.fromfile('configs/demo/cmt_aqr_synthetic_tiny_fixed_routing.py')
    detector = build_model(cfg.model)
    (hook_cfg, ) = cfg.custom_hooks
    HOOKS.build(hook_cfg).before_run(_runner(detector))

    # two steps of the config's optimizer on a loss that reaches every parameter: alpha keeps its value
    parameters = dict(detector.named_parameters())
    (alpha_name, ) = [name for name in parameters if name.endswith('bias_scale')]
    before = _state(detector)
    optimizer = build_optimizer(detector, cfg.optimizer)
    for _ in range(2):
        optimizer.zero_grad()
        sum((parameter * torch.randn_like(parameter)).sum() for parameter in parameters.values()).backward()
        optimizer.step()
    assert torch.equal(parameters[alpha_name], before[alpha_name])
    assert parameters[alpha_name].item() == cfg.model.pts_bbox_head.attention_bias_config.bias_scale
    assert not torch.equal(parameters['pts_bbox_head.shared_conv.conv.weight'],
                           before['pts_bbox_head.shared_conv.conv.weight'])
    aqr_prefixes = ('pts_bbox_head.aqr_weight_generator.', 'pts_bbox_head.attention_bias_generator.')
    assert all(p.requires_grad != name.startswith(aqr_prefixes) for name, p in parameters.items())


class _NormDetector(nn.Module):
    """A backbone with an affine BatchNorm and a head with a parameter-less (``affine=False``) one."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
        self.head = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, affine=False), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x)).pow(2).mean()

    def train_step(self, data: torch.Tensor, optimizer) -> dict:
        loss = self(data)
        return dict(loss=loss, log_vars=dict(loss=loss.item()), num_samples=len(data))


def test_a_norm_without_parameters_is_frozen_only_inside_a_frozen_module():
    detector = _NormDetector()
    freeze_parameters(detector, trainable=['head'])
    assert frozen_norm_layers(detector, trainable=['head']) == [detector.backbone[1]]
    detector = _NormDetector()
    freeze_parameters(detector, frozen=['head'])
    assert frozen_norm_layers(detector, frozen=['head']) == [detector.head[1]]
    detector = _NormDetector()
    freeze_parameters(detector, frozen=['head.0'])  # 'head.1' is not under 'head.0': it trains
    assert frozen_norm_layers(detector, frozen=['head.0']) == []


@pytest.mark.parametrize('runner_cfg', [dict(type='EpochBasedRunner', max_epochs=2),
                                        dict(type='IterBasedRunner', max_iters=4)])
def test_frozen_batchnorm_statistics_stay_under_both_runners(runner_cfg, tmp_path, monkeypatch):
    from mmcv.runner import epoch_based_runner, iter_based_runner
    for module in (epoch_based_runner, iter_based_runner):  # no pauses between epochs and after the run
        monkeypatch.setattr(module, 'time', SimpleNamespace(sleep=lambda seconds: None))
    torch.manual_seed(0)
    detector = _NormDetector()
    runner = build_runner(runner_cfg, default_args=dict(
        model=detector, optimizer=build_optimizer(detector, dict(type='SGD', lr=0.1)), work_dir=str(tmp_path),
        logger=logging.getLogger('test_freeze_parameters')))
    runner.register_training_hooks(lr_config=None, optimizer_config=dict(grad_clip=None))
    runner.register_hook(FreezeParametersHook(trainable=['head']))
    before = _state(detector)
    runner.run([DataLoader(torch.randn(8, 4) * 2 + 3, batch_size=4)], [('train', 1)])
    after = detector.state_dict()
    assert runner.iter == 4
    changed = sorted(name for name in before if not torch.equal(before[name], after[name]))
    # the backbone's weights and running statistics are those it started with; the head's norm (no parameters,
    # inside the trainable head) kept updating its statistics
    assert changed == ['head.0.bias', 'head.0.weight', 'head.1.num_batches_tracked', 'head.1.running_mean',
                       'head.1.running_var', 'head.2.bias', 'head.2.weight']


def test_freeze_before_wrapping_applies_only_the_freeze_hooks_of_the_config():
    detector = _NormDetector()
    freeze_before_wrapping(detector, [dict(type='EMAHook'), dict(type='FreezeParametersHook', trainable=['head'],
                                                                 priority='HIGH')])
    assert [name for name, p in detector.named_parameters() if p.requires_grad] == [
        'head.0.weight', 'head.0.bias', 'head.2.weight', 'head.2.bias']
    detector = _NormDetector()
    freeze_before_wrapping(detector, None)
    freeze_before_wrapping(detector, [FreezeParametersHook(frozen=['head'])])
    assert [name for name, p in detector.named_parameters() if p.requires_grad] == [
        'backbone.0.weight', 'backbone.0.bias', 'backbone.1.weight', 'backbone.1.bias']


def test_the_hook_refuses_to_freeze_parameters_a_distributed_wrapper_registered():
    from torch.nn.parallel import DistributedDataParallel

    class _FakeDDP(DistributedDataParallel):
        def __init__(self, module: nn.Module) -> None:  # no process group: only the type matters here
            nn.Module.__init__(self)
            self.module = module

    detector = _NormDetector()
    hook = FreezeParametersHook(trainable=['head'])
    with pytest.raises(RuntimeError, match='freeze_before_wrapping'):
        hook.before_run(_runner(_FakeDDP(detector)))
    freeze_before_wrapping(detector, [hook])
    hook.before_run(_runner(_FakeDDP(detector)))  # frozen before wrapping: accepted
    assert [name for name, p in detector.named_parameters() if p.requires_grad][0] == 'head.0.weight'
