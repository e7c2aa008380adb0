"""Training-log values that stay on the device until the logger reads them: one transfer per logging interval.

mmdet's ``_parse_losses`` reads every log variable with ``.item()`` and mmcv's
``OptimizerHook`` the gradient norm with ``float()``: on a GPU each is a
host synchronisation, dozens per training step. With
``keep_log_vars_on_device`` set (``train_detector`` sets it),
``CmtDetector._parse_losses`` returns its log variables as detached 0-dim
device tensors instead (one ``all_reduce`` of them stacked in a distributed
run), and

* :class:`DeviceLogBuffer` (installed by ``train_detector`` as the runner's
  ``log_buffer``) keeps them as they come and reads all of them, per device
  one stacked copy, when a logger asks for the averages (``average``: once
  per logging interval and at the end of an epoch);
* :class:`DeviceLogOptimizerHook` (``type='DeviceLogOptimizerHook'``, the
  default type ``train_detector`` gives an ``optimizer_config`` without one)
  is mmcv's ``OptimizerHook`` logging the clipped gradient norm as a device
  tensor.
"""
from typing import Dict, Hashable, List, Mapping, Tuple, Union

import torch
import torch.distributed as dist
from mmcv.runner import HOOKS, LogBuffer, OptimizerHook
from torch import Tensor


def parse_losses_on_device(losses: Dict[str, Union[Tensor, List[Tensor]]]) -> Tuple[Tensor, Dict[str, Tensor]]:
    """mmdet's ``_parse_losses`` without reading a value on the host.

    Args:
        losses (dict): name -> a tensor or a list of tensors (each averaged);
            the names containing ``'loss'`` are summed into the total.

    Returns:
        tuple[Tensor, dict[str, Tensor]]: the total loss (differentiable) and
        the log variables, ``loss`` last, as detached 0-dim float tensors on
        the loss's device, averaged over the processes of a distributed run
        (one ``all_reduce`` of them stacked).

    Raises:
        TypeError: a value that is neither a tensor nor a list of tensors.
        RuntimeError: in a distributed run, processes that log different
            numbers of variables (they would wait for each other forever).
    """
    log_vars: Dict[str, Tensor] = {}
    for name, value in losses.items():
        if isinstance(value, Tensor):
            log_vars[name] = value.mean()
        elif isinstance(value, list) and all(isinstance(item, Tensor) for item in value):
            log_vars[name] = sum(item.mean() for item in value)
        else:
            raise TypeError(f'loss {name!r} is a {type(value).__name__}, not a tensor or a list of tensors')
    loss = sum(value for name, value in log_vars.items() if 'loss' in name)
    log_vars['loss'] = loss
    values = torch.stack([value.detach().float().reshape(()) for value in log_vars.values()])
    if dist.is_available() and dist.is_initialized():
        _check_same_log_names(tuple(log_vars))
        dist.all_reduce(values.div_(dist.get_world_size()))
    return loss, dict(zip(log_vars, values.unbind()))


def read_scalars(values: Mapping[Hashable, Tensor]) -> Dict[Hashable, float]:
    """The 0-dim tensors of ``values`` as floats, same keys: one stacked transfer per device."""
    by_device: Dict[torch.device, List[Hashable]] = {}
    for key, value in values.items():
        by_device.setdefault(value.device, []).append(key)
    floats = {}
    for keys in by_device.values():
        stacked = torch.stack([values[key].detach().float().reshape(()) for key in keys]).tolist()
        floats.update(zip(keys, stacked))
    return {key: floats[key] for key in values}


_CHECKED_LOG_NAMES = set()


def _check_same_log_names(names: Tuple[str, ...]) -> None:
    """Raise unless every process logs as many variables; compared once per set of names (it waits for the
    other processes), since a training run logs the same names at every step."""
    if names in _CHECKED_LOG_NAMES:
        return
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, len(names))
    if len(set(counts)) != 1:
        raise RuntimeError(f'the processes log different numbers of variables {counts}; this one logs {list(names)}')
    _CHECKED_LOG_NAMES.add(names)


class DeviceLogBuffer(LogBuffer):
    """mmcv's ``LogBuffer`` that accepts device tensors and reads them only when averaging."""

    def __init__(self) -> None:
        super().__init__()
        self._on_device: List[Tuple[str, int]] = []

    def clear(self) -> None:
        super().clear()
        self._on_device = []

    def update(self, vars: Dict[str, object], count: int = 1) -> None:
        """Append the values of ``vars`` (numbers or 0-dim tensors, on any device) without reading them."""
        super().update(vars, count)
        for key, value in vars.items():
            if isinstance(value, Tensor):
                self._on_device.append((key, len(self.val_history[key]) - 1))

    def average(self, n: int = 0) -> None:
        """mmcv's average of the latest ``n`` values, after one transfer per device of every tensor not read yet."""
        self.read_device_values()
        super().average(n)

    def read_device_values(self) -> None:
        """Replace the buffered tensors by their values: one stacked copy per device (:func:`read_scalars`)."""
        values = read_scalars({(key, index): self.val_history[key][index] for key, index in self._on_device})
        for (key, index), value in values.items():
            self.val_history[key][index] = value
        self._on_device = []


@HOOKS.register_module()
class DeviceLogOptimizerHook(OptimizerHook):
    """mmcv's ``OptimizerHook`` (backward, optional gradient clipping, step) logging the gradient norm unread.

    Args:
        grad_clip (dict, optional): ``clip_grad_norm_`` arguments
            (``max_norm``, ``norm_type``); None: no clipping.
        detect_anomalous_params (bool): as in mmcv's ``OptimizerHook``.
    """

    def after_train_iter(self, runner) -> None:
        runner.optimizer.zero_grad()
        if self.detect_anomalous_params:
            self.detect_anomalous_parameters(runner.outputs['loss'], runner)
        runner.outputs['loss'].backward()
        if self.grad_clip is not None:
            grad_norm = self.clip_grads(runner.model.parameters())
            if grad_norm is not None:
                # a plain LogBuffer (another training loop) cannot average device tensors: give it the number
                value = grad_norm.detach() if isinstance(runner.log_buffer, DeviceLogBuffer) else float(grad_norm)
                runner.log_buffer.update({'grad_norm': value}, runner.outputs['num_samples'])
        runner.optimizer.step()
