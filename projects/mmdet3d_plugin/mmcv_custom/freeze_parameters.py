"""Train only some modules of a detector and freeze the rest (MoME's stage 2: only the router learns).

``custom_hooks = [dict(type='FreezeParametersHook', trainable=['pts_bbox_head.aqr_weight_generator'])]``
sets ``requires_grad=False`` on every other parameter, so no gradient reaches them and the optimizer (which
skips parameters without a gradient) leaves them and their weight decay alone; the BatchNorms among the frozen
modules are kept in eval mode, so their running statistics stay those of the loaded checkpoint too.
``frozen=[...]`` names the other way round: those modules keep their weights, everything else trains (a router
held at its initial value while the detector learns). ``train_detector`` freezes the bare model before it wraps
it (:func:`freeze_before_wrapping`: ``DistributedDataParallel`` must only see the trainable parameters) and
before ``load_from`` or a resume, which load weights and leave ``requires_grad`` alone; the hook's
``before_run`` freezes (again), checks and logs.
"""
from typing import List, Optional, Sequence, Tuple, Union

from mmcv.parallel import is_module_wrapper
from mmcv.runner import HOOKS, Hook
from torch import nn
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.parallel import DistributedDataParallel


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


def _selected(model: nn.Module, trainable: Optional[Sequence[str]],
              frozen: Optional[Sequence[str]]) -> Tuple[List[str], List[str], List[str], bool]:
    """The names of the parameters to keep and to freeze, the checked prefixes, and whether they name the kept ones."""
    prefixes, naming_trainable = _check_selection(trainable, frozen)
    names = [name for name, _ in model.named_parameters()]
    unmatched = [prefix for prefix in prefixes if not any(_under(name, [prefix]) for name in names)]
    if unmatched:
        raise ValueError(f'FreezeParametersHook: no parameter under {unmatched}; the model has modules '
                         f'{sorted({name.rsplit(".", 1)[0] for name in names})[:20]}...')
    kept = [name for name in names if _under(name, prefixes) == naming_trainable]
    frozen_names = [name for name in names if _under(name, prefixes) != naming_trainable]
    return kept, frozen_names, prefixes, naming_trainable


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
    kept, frozen_names, _, _ = _selected(model, trainable, frozen)
    parameters = dict(model.named_parameters())
    for name in frozen_names:
        parameters[name].requires_grad_(False)
    return kept, frozen_names


def frozen_norm_layers(model: nn.Module, trainable: Optional[Sequence[str]] = None,
                       frozen: Optional[Sequence[str]] = None) -> List[nn.Module]:
    """The normalisation layers with running statistics that must stay in eval mode.

    A layer with parameters is frozen when none of them requires a gradient (frozen by :func:`freeze_parameters`
    or otherwise); a layer without parameters (``affine=False``) when its own name is frozen by ``trainable`` /
    ``frozen``, decided as :func:`freeze_parameters` decides for parameters.

    Args:
        model (nn.Module): the detector (not a wrapper).
        trainable (Sequence[str], optional): as in :func:`freeze_parameters`.
        frozen (Sequence[str], optional): as in :func:`freeze_parameters`.

    Returns:
        list[nn.Module]: the BatchNorm / SyncBatchNorm / InstanceNorm layers to keep in eval mode.
    """
    _, _, prefixes, naming_trainable = _selected(model, trainable, frozen)
    layers = []
    for name, module in model.named_modules():
        if not (isinstance(module, _NormBase) and module.track_running_stats):
            continue
        parameters = list(module.parameters())
        if parameters:
            if not any(parameter.requires_grad for parameter in parameters):
                layers.append(module)
        elif _under(name, prefixes) != naming_trainable:
            layers.append(module)
    return layers


def freeze_before_wrapping(model: nn.Module, custom_hooks: Optional[Sequence[Union[dict, Hook]]]) -> None:
    """Freeze ``model`` now as each :class:`FreezeParametersHook` among ``custom_hooks`` will at ``before_run``.

    ``DistributedDataParallel`` registers the parameters that require a gradient when it is built and, without
    ``find_unused_parameters``, waits for a gradient of each of them in every iteration: parameters frozen after
    the wrapper is built never get one, and the second iteration fails ("Expected to have finished reduction in
    the prior iteration"). ``train_detector`` calls this on the bare model before wrapping it; the hook's
    ``before_run`` then finds the parameters frozen, logs the selection and keeps the frozen norms in eval mode.
    Freezing only sets ``requires_grad``, so ``load_from`` and resuming may come after it.

    Args:
        model (nn.Module): the detector (not a wrapper).
        custom_hooks (Sequence[dict | Hook], optional): ``cfg.custom_hooks``.
    """
    for item in custom_hooks or []:
        if isinstance(item, dict):
            hook_type = HOOKS.get(item['type']) if isinstance(item['type'], str) else item['type']
            if not (isinstance(hook_type, type) and issubclass(hook_type, FreezeParametersHook)):
                continue
            item = HOOKS.build({key: value for key, value in item.items() if key != 'priority'})
        if isinstance(item, FreezeParametersHook):
            freeze_parameters(model, item.trainable, item.frozen)


@HOOKS.register_module()
class FreezeParametersHook(Hook):
    """Freeze every parameter outside ``trainable`` (or under ``frozen``) and keep the frozen norms' statistics.

    The runner calls ``model.train()`` before every epoch (``EpochBasedRunner``) or every iteration
    (``IterBasedRunner``); the frozen norm layers (:func:`frozen_norm_layers`) go back to eval mode right after
    both, so their running statistics stay those of the loaded checkpoint.

    Args:
        trainable (Sequence[str], optional): module names relative to the detector whose parameters keep
            training (see :func:`freeze_parameters`).
        frozen (Sequence[str], optional): instead of ``trainable``: the module names to freeze.
    """

    def __init__(self, trainable: Optional[Sequence[str]] = None, frozen: Optional[Sequence[str]] = None) -> None:
        _check_selection(trainable, frozen)
        self.trainable = None if trainable is None else list(trainable)
        self.frozen = None if frozen is None else list(frozen)
        self._frozen_norms: List[nn.Module] = []

    @staticmethod
    def _detector(runner) -> nn.Module:
        return runner.model.module if is_module_wrapper(runner.model) else runner.model

    def before_run(self, runner) -> None:
        """Freeze the parameters (refusing a ``DistributedDataParallel`` built before) and log the selection.

        Raises:
            RuntimeError: the model is wrapped in ``DistributedDataParallel`` and some parameters to freeze
                still require a gradient (:func:`freeze_before_wrapping` was not called before wrapping).
        """
        detector = self._detector(runner)
        _, to_freeze, _, _ = _selected(detector, self.trainable, self.frozen)
        parameters = dict(detector.named_parameters())
        late = [name for name in to_freeze if parameters[name].requires_grad]
        if late and isinstance(runner.model, DistributedDataParallel):
            raise RuntimeError(f'FreezeParametersHook: {len(late)} parameters (e.g. {late[0]}) would be frozen after '
                               f'DistributedDataParallel registered them, which then waits for their gradients '
                               f'forever; call freeze_before_wrapping(model, cfg.custom_hooks) before wrapping')
        kept, frozen = freeze_parameters(detector, self.trainable, self.frozen)
        self._frozen_norms = frozen_norm_layers(detector, self.trainable, self.frozen)
        count = sum(parameter.numel() for parameter in detector.parameters() if parameter.requires_grad)
        selection = f'under {self.trainable}' if self.trainable is not None else f'outside {self.frozen}'
        runner.logger.info(f'FreezeParametersHook: training {len(kept)} parameter tensors ({count} values) '
                           f'{selection}; {len(frozen)} frozen, {len(self._frozen_norms)} norm layers kept in eval '
                           f'mode')

    def _keep_norms_in_eval(self) -> None:
        for module in self._frozen_norms:
            module.eval()

    def before_train_epoch(self, runner) -> None:
        # EpochBasedRunner has just called model.train()
        self._keep_norms_in_eval()

    def before_train_iter(self, runner) -> None:
        # IterBasedRunner calls model.train() before every iteration
        self._keep_norms_in_eval()
