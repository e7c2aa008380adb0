"""A training iteration's parameter update, as mmdet's ``train_detector`` and mmcv's ``OptimizerHook`` make it.

``train_detector`` builds the optimizer with mmcv's ``build_optimizer`` from
the config's ``optimizer`` (per-module learning rates included); after each
``train_step`` the ``OptimizerHook`` of the config's ``optimizer_config``
zeroes the gradients, runs the backward, clips the gradient norm
(``grad_clip``) and steps. :class:`OptimizerStep` does the same outside a
runner (``tools/check_gpu.py``'s training check, ``tools/benchmark_model.py``)::

    update = OptimizerStep(model, cfg)
    outputs = model.train_step(batch, None)
    grad_norm = update(outputs['loss'])      # a device tensor, or None without grad_clip
"""
from typing import List, Optional

from mmcv import Config
from torch import Tensor, nn
from torch.nn.utils import clip_grad_norm_


class OptimizerStep:
    """The optimizer of a config's ``optimizer`` and the update of its ``optimizer_config``.

    Args:
        model (nn.Module): the detector (on its device).
        cfg (Config): a training config: ``optimizer`` and, optionally,
            ``optimizer_config.grad_clip`` (``clip_grad_norm_`` arguments).
    """

    def __init__(self, model: nn.Module, cfg: Config) -> None:
        from mmcv.runner import build_optimizer

        self.model = model
        self.optimizer = build_optimizer(model, cfg.optimizer)
        self.grad_clip = (cfg.get('optimizer_config') or {}).get('grad_clip')

    def _trained_parameters(self) -> List[Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad and p.grad is not None]

    def clip_grads(self) -> Optional[Tensor]:
        """Clip the gradients as ``OptimizerHook.clip_grads`` does; their total norm (a device tensor: reading
        it waits for the device), or None without ``grad_clip`` or gradients."""
        params = self._trained_parameters()
        if not self.grad_clip or not params:
            return None
        return clip_grad_norm_(params, **self.grad_clip)

    def backward(self, loss: Tensor) -> None:
        """The first half of :meth:`__call__`: zero the gradients, backward ``loss``."""
        self.optimizer.zero_grad()
        loss.backward()

    def step(self) -> Optional[Tensor]:
        """The second half of :meth:`__call__`: clip, step; the gradient norm (see :meth:`clip_grads`)."""
        grad_norm = self.clip_grads()
        self.optimizer.step()
        return grad_norm

    def __call__(self, loss: Tensor) -> Optional[Tensor]:
        """``OptimizerHook.after_train_iter``: zero the gradients, backward ``loss``, clip, step; the gradient
        norm (see :meth:`clip_grads`)."""
        self.backward(loss)
        return self.step()
