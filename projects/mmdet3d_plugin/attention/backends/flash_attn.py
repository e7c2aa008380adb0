"""``flash_attn``: the ``flash-attn`` package (optional extra), for bias-free attention on CUDA.

The package is looked up with ``importlib`` when a call is checked and
imported only inside :meth:`FlashAttnBackend.forward`, never at module import.
It applies no bias and no key padding mask: such calls raise.
"""
import importlib.util
from typing import List

import torch
from torch import Tensor

from .base import AttentionBackend, AttentionCall

MAX_HEAD_DIM = 256


class FlashAttnBackend(AttentionBackend):
    """``flash_attn.flash_attn_func`` on ``[bs, L, heads, d]`` views of q, k, v."""

    name = 'flash_attn'

    def not_supported_reasons(self, call: AttentionCall) -> List[str]:
        reasons = []
        if call.bias is not None:
            reasons.append(f'flash_attn applies no bias (got {call.bias.describe()})')
        if call.key_padding_mask is not None:
            reasons.append('flash_attn applies no key padding mask')
        if call.device_type != 'cuda':
            reasons.append(f'flash_attn needs a CUDA device, inputs are on {call.device_type}')
        if call.q.dtype not in (torch.float16, torch.bfloat16):
            reasons.append(f'flash_attn needs float16 or bfloat16 inputs, got {call.q.dtype}')
        if call.head_dim % 8 or call.head_dim > MAX_HEAD_DIM:
            reasons.append(f'flash_attn needs a head dim that is a multiple of 8 and <= {MAX_HEAD_DIM}, '
                           f'got {call.head_dim}')
        if importlib.util.find_spec('flash_attn') is None:
            reasons.append('the flash-attn package is not installed (pip install -r requirements/optional.txt)')
        return reasons

    def forward(self, call: AttentionCall) -> Tensor:
        from flash_attn import flash_attn_func
        out = flash_attn_func(call.q.transpose(1, 2), call.k.transpose(1, 2), call.v.transpose(1, 2),
                              dropout_p=call.dropout_p, softmax_scale=call.scale)
        return out.transpose(1, 2)
