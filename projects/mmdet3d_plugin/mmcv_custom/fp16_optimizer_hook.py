"""``CustomFp16OptimizerHook``: mmcv's fp16 optimizer hook with per-module fp16 switches."""
from typing import Dict, Optional

import torch
from mmcv.parallel import is_module_wrapper
from mmcv.runner import HOOKS, Fp16OptimizerHook, wrap_fp16_model
from torch import nn


def check_custom_fp16(model: nn.Module, custom_fp16: Optional[Dict[str, bool]]) -> None:
    """``KeyError`` if ``custom_fp16`` names a module that is not a top-level module of ``model``."""
    unknown = [name for name in custom_fp16 or {} if name not in model._modules]
    if unknown:
        raise KeyError(f'custom_fp16 names {unknown}, which are not top-level modules of the model '
                       f'(available: {sorted(model._modules)})')


def apply_custom_fp16(model: nn.Module, custom_fp16: Optional[Dict[str, bool]]) -> None:
    """Set ``fp16_enabled`` of the top-level modules ``custom_fp16`` names (name -> value; checked first)."""
    check_custom_fp16(model, custom_fp16)
    for name, enabled in (custom_fp16 or {}).items():
        model._modules[name].fp16_enabled = enabled


def enable_config_fp16(model: nn.Module, optimizer_config: Dict) -> None:
    """What a config's fp16 optimizer hook does to the model before training (``tools/benchmark_model.py
    --mixed-precision``): every module's ``auto_fp16`` methods run under autocast (``wrap_fp16_model``), then
    ``custom_fp16`` keeps the modules it names in fp32.

    Raises:
        ValueError: ``optimizer_config`` is no fp16 optimizer hook.
    """
    if 'Fp16' not in str(optimizer_config.get('type', '')):
        raise ValueError(f"the config trains without mixed precision: its optimizer_config is "
                         f"{optimizer_config.get('type')!r}, not an fp16 optimizer hook")
    wrap_fp16_model(model)
    apply_custom_fp16(model, optimizer_config.get('custom_fp16'))


@HOOKS.register_module()
class CustomFp16OptimizerHook(Fp16OptimizerHook):
    """Mixed-precision training where chosen top-level modules stay in fp32.

    mmcv's ``Fp16OptimizerHook`` turns on ``fp16_enabled`` for every module
    (so their ``auto_fp16`` methods run under autocast); afterwards
    ``custom_fp16`` sets it per top-level module of the detector, e.g.
    ``dict(pts_voxel_encoder=False, pts_middle_encoder=False,
    pts_bbox_head=False)`` as in upstream CMT's configs.

    Mixed precision needs CUDA. Without it the hook logs a warning and trains
    in fp32 (the gradient scaler disables itself on CPU, gradient clipping
    still applies), so GPU configs also run on a CPU-only machine.

    Args:
        custom_fp16 (dict[str, bool], optional): top-level module name ->
            ``fp16_enabled`` value.
        **kwargs: ``Fp16OptimizerHook`` arguments (``grad_clip``,
            ``loss_scale``, ``distributed``, ...).
    """

    def __init__(self, custom_fp16: Optional[Dict[str, bool]] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.custom_fp16 = dict(custom_fp16 or {})

    def before_run(self, runner) -> None:
        model = runner.model.module if is_module_wrapper(runner.model) else runner.model
        check_custom_fp16(model, self.custom_fp16)
        if not torch.cuda.is_available():
            runner.logger.warning('CustomFp16OptimizerHook: CUDA is not available, training in fp32')
            return
        super().before_run(runner)
        apply_custom_fp16(model, self.custom_fp16)
