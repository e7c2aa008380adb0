"""What every attention backend shares: the call description, the backend interface and its error.

A backend states which calls it cannot run, and why, in
:meth:`AttentionBackend.not_supported_reasons` (in the manner of xFormers'
``not_supported_reasons``); calling it on such a call raises
:class:`UnsupportedAttentionError` with those reasons instead of silently
dropping a bias, a mask or dropout.
"""
from dataclasses import dataclass
from typing import List, Optional, Tuple, Type, Union

import torch
from torch import Tensor

from ..bias import AttentionBias, BiasPart, SegmentBias, WindowBias


class UnsupportedAttentionError(ValueError):
    """A backend was asked to apply something it cannot apply exactly.

    Args:
        backend (str): the backend's name.
        reasons (list[str]): why it cannot run the call.
    """

    def __init__(self, backend: str, reasons: List[str]) -> None:
        self.backend = backend
        self.reasons = list(reasons)
        super().__init__(f"attention backend '{backend}' cannot run this call: " + '; '.join(self.reasons))


@dataclass(frozen=True)
class AttentionCall:
    """One attention call, validated by ``apply_attention``.

    Attributes:
        q (Tensor): ``[bs, heads, Q, d]``.
        k (Tensor | None): ``[bs, heads, K, d]`` (None when only choosing a backend).
        v (Tensor | None): ``[bs, heads, K, d]``.
        bias (AttentionBias | None): additive bias on the ``[bs, heads, Q, K]`` scores.
        key_padding_mask (Tensor | None): ``[bs, K]`` bool, True = padding.
        dropout_p (float): dropout on the attention probabilities.
        scale (float): multiplier of ``q k^T``.
    """

    q: Tensor
    k: Optional[Tensor]
    v: Optional[Tensor]
    bias: Optional[AttentionBias]
    key_padding_mask: Optional[Tensor]
    dropout_p: float
    scale: float

    @property
    def device_type(self) -> str:
        """``'cpu'``, ``'cuda'``, ..."""
        return self.q.device.type

    @property
    def head_dim(self) -> int:
        """d."""
        return self.q.size(-1)

    @property
    def needs_grad(self) -> bool:
        """Whether autograd will differentiate through the call."""
        if not torch.is_grad_enabled():
            return False
        tensors = [t for t in (self.q, self.k, self.v) if t is not None]
        return any(t.requires_grad for t in tensors) or (self.bias is not None and self.bias.requires_grad)

    @property
    def qkv_need_grad(self) -> bool:
        """Whether q, k or v require grad (with grad mode on)."""
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (self.q, self.k, self.v))

    def foreign_parts(self, supported: Tuple[Type[BiasPart], ...]) -> List[str]:
        """Descriptions of the bias parts that are not instances of ``supported``."""
        if self.bias is None:
            return []
        return [part.describe() for part in self.bias.parts if not isinstance(part, supported)]

    def describe(self) -> str:
        """Short description of the call for logs."""
        bias = self.bias.describe() if self.bias is not None else 'no bias'
        extras = []
        if self.key_padding_mask is not None:
            extras.append('key padding mask')
        if self.dropout_p > 0:
            extras.append(f'dropout {self.dropout_p}')
        dtype = str(self.q.dtype).replace('torch.', '')
        return ', '.join([bias] + extras + [f'{self.device_type} {dtype}'])


class AttentionBackend:
    """Interface of an attention backend.

    Subclasses set ``name`` and implement :meth:`not_supported_reasons` and
    :meth:`forward`; calling the backend checks the reasons first.
    """

    name = ''

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        """Why this backend cannot run ``call`` (empty when it can)."""
        raise NotImplementedError

    def forward(self, call: AttentionCall) -> Tensor:
        """Attention output ``[bs, heads, Q, d]`` in q's dtype."""
        raise NotImplementedError

    def __call__(self, call: AttentionCall) -> Tensor:
        reasons = self.not_supported_reasons(call)
        if reasons:
            raise UnsupportedAttentionError(self.name, reasons)
        return self.forward(call)


def segment_window_reasons(call: AttentionCall, backend: str) -> List[str]:
    """Why a backend that applies :class:`SegmentBias` and :class:`WindowBias` parts and no dropout cannot run
    ``call`` (``segment``, ``tiled_bias``)."""
    reasons = []
    foreign = call.foreign_parts((SegmentBias, WindowBias))
    if foreign:
        reasons.append(f'{backend} applies only SegmentBias and WindowBias, not {", ".join(foreign)}')
    if call.dropout_p > 0:
        reasons.append(f'{backend} applies no attention dropout (got dropout_p={call.dropout_p})')
    return reasons


def sum_broadcast_heads(grad: Tensor, dim: int, heads: int) -> Tensor:
    """A per-head gradient summed over ``dim`` (kept) where the tensor it belongs to has one head shared by all."""
    return grad.sum(dim, keepdim=True) if heads == 1 else grad


def dense_additive_bias(bias: Optional[Union[AttentionBias, Tensor]], key_padding_mask: Optional[Tensor],
                        dtype: torch.dtype) -> Optional[Tensor]:
    """A bias and a key padding mask as one additive tensor.

    Args:
        bias (AttentionBias | Tensor, optional): the structured bias, or a
            dense additive one (the eager reference attention's masks).
        key_padding_mask (Tensor, optional): ``[bs, K]`` bool, True = padding.
        dtype (torch.dtype): dtype of the result.

    Where no gradient flows to a structured bias (inference), its dense form is made
    once per dtype and reused while the bias lives: the decoder layers share
    one bias, so they share its dense tensor. A differentiable one is made
    on every call: a checkpointed layer (``with_cp``) recomputes its forward
    and must save the same tensors again.

    Returns:
        Tensor | None: ``[bs | 1, heads | 1, Q | 1, K]`` with ``-inf`` at
        blocked and padded keys, or None when there is nothing to add.
    """
    dense = None
    if isinstance(bias, AttentionBias) and not (torch.is_grad_enabled() and bias.requires_grad):
        dense = bias.derived(('dense', dtype), lambda: bias.to_dense(dtype))
    elif bias is not None:
        dense = bias.to_dense(dtype)
    if key_padding_mask is not None:
        padding = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
        padding = padding.masked_fill(key_padding_mask, float('-inf'))[:, None, None]
        dense = padding if dense is None else dense + padding
    return dense


def dense_blocking_mask(call: AttentionCall) -> Optional[Tensor]:
    """The call's bias and key padding as a bool mask, when both are pure masks.

    Returns:
        Tensor | None: ``[bs | 1, heads | 1, Q | 1, K]`` bool, True = blocked;
        None when the bias has an additive (float) part or there is nothing
        to apply.
    """
    mask = None
    if call.bias is not None:
        if any(not part.is_mask for part in call.bias.parts):
            return None
        for part in call.bias.parts:
            mask = part.values if mask is None else mask | part.values
    if call.key_padding_mask is not None:
        padding = call.key_padding_mask[:, None, None]
        mask = padding if mask is None else mask | padding
    return mask


def empty_sample_mask(key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """``[bs, 1, 1, 1]`` bool, True for samples whose keys are all padding (None without a mask)."""
    if key_padding_mask is None:
        return None
    return key_padding_mask.all(-1)[:, None, None, None]
