"""The ``'triton'`` slot products as PyTorch custom operators (``cmt_aqr::slot_dot``, ``cmt_aqr::slot_weighted_sum``,
``cmt_aqr::slot_scatter_add_``).

Registered with ``torch.library.custom_op``: the real implementation launches
the Triton kernels of :mod:`.slot_kernels` (imported on the first call:
Triton is a CUDA extra), the fake one only states the output's shape and
dtype, so :class:`~.window_slots.SlotPattern` with the ``'triton'``
formulation (the CUDA default) traces under ``FakeTensorMode`` on a machine
without a GPU, as the fake-CUDA tests and ``tools/count_device_ops.py`` run
the model, and ``torch.compile`` can see through it. Gradients are written
out by the callers (:class:`~...models.aqr.local_window.WindowAttentionFunction`
and the ``segment`` backend's window correction), so the operators have no
autograd formula of their own. Arguments as in :mod:`.slot_kernels`; ``valid``
is the ``[bs, Q, L]`` uint8 validity or None.
"""
from typing import Optional

import torch
from torch import Tensor


def _slot_kernels():
    """:mod:`.slot_kernels`, imported on first use (it imports Triton, a CUDA extra)."""
    try:
        from . import slot_kernels
    except ImportError as error:
        raise ImportError(f"the 'triton' slot products need the triton package (installed with CUDA builds of "
                          f'torch): {error}') from error
    return slot_kernels


@torch.library.custom_op('cmt_aqr::slot_dot', mutates_args=())
def slot_dot(index: Tensor, a: Tensor, x: Tensor, scale: float) -> Tensor:
    """``scale * a . x`` at the slots: ``[bs, heads, Q, L]`` float32."""
    return _slot_kernels().slot_dot(index, a, x, scale)


@slot_dot.register_fake
def _(index, a, x, scale):
    return a.new_empty((*a.shape[:3], index.size(-1)), dtype=torch.float32)


@torch.library.custom_op('cmt_aqr::slot_weighted_sum', mutates_args=())
def slot_weighted_sum(index: Tensor, valid: Optional[Tensor], weights: Tensor, x: Tensor) -> Tensor:
    """``sum_j weights[..., q, j] x[..., index[q, j], :]`` over the valid slots: ``[bs, heads, Q, d]`` float32."""
    return _slot_kernels().slot_weighted_sum(index, valid, weights, x)


@slot_weighted_sum.register_fake
def _(index, valid, weights, x):
    return x.new_empty((*weights.shape[:3], x.size(-1)), dtype=torch.float32)


@torch.library.custom_op('cmt_aqr::slot_scatter_add_', mutates_args=('target', ))
def slot_scatter_add_(index: Tensor, valid: Optional[Tensor], target: Tensor, weights: Tensor, a: Tensor,
                      alpha: float) -> None:
    """``target[..., index[q, j], :] += alpha * weights[..., q, j] a[..., q, :]`` over the live slots, in place."""
    _slot_kernels().slot_scatter_add_(index, valid, target, weights, a, alpha)


@slot_scatter_add_.register_fake
def _(index, valid, target, weights, a, alpha):
    return None
