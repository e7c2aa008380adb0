"""Train only some modules of a detector and freeze the rest (MoME's stage 2: only the router learns).

``custom_hooks = [dict(type='FreezeParametersHook', trainable=['pts_bbox_head.aqr_weight_generator'])]``
sets ``requires_grad=False`` on every other parameter when the run starts (after ``load_from`` or a
resume), so no gradient reaches them and the optimizer (which skips parameters without a gradient)
leaves them and their weight decay alone; the BatchNorms among the frozen modules are kept in eval mode,
so their running statistics stay those of the loaded checkpoint too. ``frozen=[...]`` names the other
way round: those modules keep their weights, everything else trains (a router held at its initial
value while the detector learns).
"""
from typing import List, Optional, Sequence, Tuple

from mmcv.parallel import is_module_wrapper
from mmcv.runner import HOOKS, Hook
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def _under(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + '.') for prefix in prefixes)


def _check_selection(trainable: Optional[Sequence[str]], frozen: Optional[Sequence[str]]) -> Tuple[List[str], bool]:
    """The module names of exactly one of ``trainable`` / ``frozen``, and whether they name the trainable ones."""
    if (trainable is None) == (frozen is None):
        raise ValueError('FreezeParametersHook: give exactly one of trainable=[...] (train only these modules) '
                         f'and frozen=[...] (freeze only these), got trainable={trainable}, frozen={frozen}')
    names = list(trainable if trainable is not None else frozen)
    if not names:
        raise ValueError(f'FreezeParametersHook: {"trainable" if trainable is not None else "frozen"} must name '
                         f'at least one module')
    return names, trainable is not None


def freeze_parameters(model: nn.Module, trainable: Optional[Sequence[str]] = None,
                      frozen: Optional[Sequence[str]] = None) -> Tuple[List[str], List[str]]:
    """Set ``requires_grad=False`` on every parameter outside ``trainable``, or on every parameter under ``frozen``.

    Args:
        model (nn.Module): the detector (not a wrapper).
        trainable (Sequence[str], optional): module names relative to ``model``
            (``'pts_bbox_head.aqr_weight_generator'``) whose parameters keep training; a parameter is under a
            name when its name is that name or starts with it and a dot.
        frozen (Sequence[str], optional): instead of ``trainable``: the module names whose parameters are
            frozen; every other parameter keeps training.

    Returns:
        tuple[list[str], list[str]]: the names of the trainable and of the frozen parameters.

    Raises:
        ValueError: both or neither of ``trainable`` / ``frozen`` given, or a name matches no parameter (a typo,
            or a model without that module).
    """
    prefixes, naming_trainable = _check_selection(trainable, frozen)
    names = [name for name, _ in model.named_parameters()]
    unmatched = [prefix for prefix in prefixes if not any(_under(name, [prefix]) for name in names)]
    if unmatched:
        raise ValueError(f'FreezeParametersHook: no parameter under {unmatched}; the model has modules '
                         f'{sorted({name.rsplit(".", 1)[0] for name in names})[:20]}...')
    kept, frozen_names = [], []
    for name, parameter in model.named_parameters():
        if _under(name, prefixes) == naming_trainable:
            kept.append(name)
        else:
            parameter.requires_grad_(False)
            frozen_names.append(name)
    return kept, frozen_names


def frozen_norm_layers(model: nn.Module) -> List[nn.Module]:
    """The BatchNorm layers of ``model`` whose parameters are all frozen (or that have none)."""
    return [module for module in model.modules() if isinstance(module, _BatchNorm)
            and not any(parameter.requires_grad for parameter in module.parameters())]


@HOOKS.register_module()
class FreezeParametersHook(Hook):
    """Freeze every parameter outside ``trainable`` (or under ``frozen``) and keep the frozen BatchNorms' statistics.

    Args:
        trainable (Sequence[str], optional): module names relative to the detector whose parameters keep
            training (see :func:`freeze_parameters`).
        frozen (Sequence[str], optional): instead of ``trainable``: the module names to freeze.
    """

    def __init__(self, trainable: Optional[Sequence[str]] = None, frozen: Optional[Sequence[str]] = None) -> None:
        _check_selection(trainable, frozen)
        self.trainable = None if trainable is None else list(trainable)
        self.frozen = None if frozen is None else list(frozen)

    @staticmethod
    def _detector(runner) -> nn.Module:
        return runner.model.module if is_module_wrapper(runner.model) else runner.model

    def before_run(self, runner) -> None:
        detector = self._detector(runner)
        kept, frozen = freeze_parameters(detector, self.trainable, self.frozen)
        count = sum(parameter.numel() for parameter in detector.parameters() if parameter.requires_grad)
        selection = f'under {self.trainable}' if self.trainable is not None else f'outside {self.frozen}'
        runner.logger.info(f'FreezeParametersHook: training {len(kept)} parameter tensors ({count} values) '
                           f'{selection}; {len(frozen)} frozen')

    def before_train_epoch(self, runner) -> None:
        # the runner has just called model.train(): the frozen BatchNorms go back to eval mode
        for module in frozen_norm_layers(self._detector(runner)):
            module.eval()
