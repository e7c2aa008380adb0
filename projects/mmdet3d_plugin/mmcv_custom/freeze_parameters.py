"""Train only some modules of a detector and freeze the rest (MoME's stage 2: only the router learns).

``custom_hooks = [dict(type='FreezeParametersHook', trainable=['pts_bbox_head.aqr_weight_generator'])]``
sets ``requires_grad=False`` on every other parameter when the run starts (after ``load_from`` or a
resume), so no gradient reaches them and the optimizer (which skips parameters without a gradient)
leaves them and their weight decay alone; the BatchNorms among the frozen modules are kept in eval mode,
so their running statistics stay those of the loaded checkpoint too.
"""
from typing import List, Sequence, Tuple

from mmcv.parallel import is_module_wrapper
from mmcv.runner import HOOKS, Hook
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def _under(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + '.') for prefix in prefixes)


def freeze_parameters(model: nn.Module, trainable: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Keep the parameters under the ``trainable`` module names trainable, set ``requires_grad=False`` on all others.

    Args:
        model (nn.Module): the detector (not a wrapper).
        trainable (Sequence[str]): module names relative to ``model`` (``'pts_bbox_head.aqr_weight_generator'``);
            a parameter is trainable when its name is one of them or starts with one of them and a dot.

    Returns:
        tuple[list[str], list[str]]: the names of the trainable and of the frozen parameters.

    Raises:
        ValueError: a ``trainable`` name matches no parameter (a typo, or a model without that module).
    """
    names = [name for name, _ in model.named_parameters()]
    unmatched = [prefix for prefix in trainable if not any(_under(name, [prefix]) for name in names)]
    if unmatched:
        raise ValueError(f'FreezeParametersHook: no parameter under {unmatched}; the model has modules '
                         f'{sorted({name.rsplit(".", 1)[0] for name in names})[:20]}...')
    kept, frozen = [], []
    for name, parameter in model.named_parameters():
        if _under(name, trainable):
            kept.append(name)
        else:
            parameter.requires_grad_(False)
            frozen.append(name)
    return kept, frozen


def frozen_norm_layers(model: nn.Module) -> List[nn.Module]:
    """The BatchNorm layers of ``model`` whose parameters are all frozen (or that have none)."""
    return [module for module in model.modules() if isinstance(module, _BatchNorm)
            and not any(parameter.requires_grad for parameter in module.parameters())]


@HOOKS.register_module()
class FreezeParametersHook(Hook):
    """Freeze every parameter outside ``trainable`` and keep the frozen BatchNorms' statistics.

    Args:
        trainable (Sequence[str]): module names relative to the detector whose parameters keep training
            (see :func:`freeze_parameters`).
    """

    def __init__(self, trainable: Sequence[str]) -> None:
        if not trainable:
            raise ValueError('FreezeParametersHook: trainable must name at least one module')
        self.trainable = list(trainable)

    @staticmethod
    def _detector(runner) -> nn.Module:
        return runner.model.module if is_module_wrapper(runner.model) else runner.model

    def before_run(self, runner) -> None:
        detector = self._detector(runner)
        kept, frozen = freeze_parameters(detector, self.trainable)
        count = sum(parameter.numel() for parameter in detector.parameters() if parameter.requires_grad)
        runner.logger.info(f'FreezeParametersHook: training {len(kept)} parameter tensors ({count} values) under '
                           f'{self.trainable}; {len(frozen)} frozen')

    def before_train_epoch(self, runner) -> None:
        # the runner has just called model.train(): the frozen BatchNorms go back to eval mode
        for module in frozen_norm_layers(self._detector(runner)):
            module.eval()
