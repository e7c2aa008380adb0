"""Model wrappers for single-process and distributed runs, on GPU or CPU.

mmcv's ``MMDataParallel`` already runs on CPU (it unpacks the
``DataContainer`` batches when no GPU is given), but its
``MMDistributedDataParallel`` only unpacks them when it has CUDA devices.
:class:`CPUDistributedDataParallel` unpacks them on CPU too, so
``torch.distributed.run`` with the gloo backend trains and tests on machines
without a GPU.
"""
from typing import Any, Tuple

import torch
from mmcv.parallel import MMDataParallel, MMDistributedDataParallel
from mmcv.parallel.scatter_gather import scatter_kwargs
from torch import nn


def unpack_for_cpu(inputs: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """Unpack ``DataContainer``s (and keep tensors) on the CPU, as ``MMDataParallel`` does without GPUs."""
    scattered_inputs, scattered_kwargs = scatter_kwargs(inputs, kwargs, [-1])
    return scattered_inputs[0], scattered_kwargs[0]


class CPUDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` for CPU modules (gloo): batches are unpacked before every step."""

    def train_step(self, *inputs, **kwargs):
        inputs, kwargs = unpack_for_cpu(inputs, kwargs)
        return super().train_step(*inputs, **kwargs)

    def val_step(self, *inputs, **kwargs):
        inputs, kwargs = unpack_for_cpu(inputs, kwargs)
        return super().val_step(*inputs, **kwargs)

    def _run_ddp_forward(self, *inputs, **kwargs) -> Any:
        inputs, kwargs = unpack_for_cpu(inputs, kwargs)
        return self.module(*inputs, **kwargs)


def wrap_model(model: nn.Module, device: str, distributed: bool, gpu_ids=(0, ), **ddp_kwargs) -> nn.Module:
    """Put ``model`` on ``device`` and wrap it for mmcv's runners and test loops.

    Args:
        model (nn.Module): the detector.
        device (str): ``'cuda'`` or ``'cpu'``.
        distributed (bool): wrap for ``torch.distributed`` (one process per device).
        gpu_ids (Sequence[int]): GPUs of a single-process CUDA run.
        **ddp_kwargs: ``DistributedDataParallel`` arguments (``broadcast_buffers``,
            ``find_unused_parameters``).

    Returns:
        nn.Module: ``MMDataParallel``, ``MMDistributedDataParallel`` or
        :class:`CPUDistributedDataParallel`.
    """
    if device == 'cuda':
        if distributed:
            return MMDistributedDataParallel(model.cuda(), device_ids=[torch.cuda.current_device()], **ddp_kwargs)
        return MMDataParallel(model.cuda(gpu_ids[0]), device_ids=list(gpu_ids))
    if device != 'cpu':
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if distributed:
        return CPUDistributedDataParallel(model.cpu(), **ddp_kwargs)
    return MMDataParallel(model.cpu())
