"""The ``tiled_bias`` kernels as PyTorch custom operators (``cmt_aqr::tiled_bias_forward`` / ``_backward``).

Registered with ``torch.library.custom_op``: the real implementation launches
the Triton kernels (:mod:`.kernels`, imported on the first call: Triton is a
CUDA extra), the fake one only states the outputs' shapes and dtypes, so the
backend traces under ``FakeTensorMode`` on a machine without a GPU (as
every backend ``auto`` can pick on CUDA is, ``tests/attention/test_fake_cuda.py``)
and ``torch.compile`` can see through it. The bias travels as the tensors of
:class:`.tables.TileBiasTables`: ``keys`` ``[5, K]``, ``centres``
``[G, bs, Q, 3]``, ``inv_half`` ``[G]``, the optional ``padding`` ``[bs, K]``
uint8, and the float32 ``amplitude`` ``[G, bs, heads, Q]`` and ``values``
``[bs, heads, Q, S]`` (heads expanded; ``S = 0``: no segment term).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .tables import TileBiasTables


def _tables(keys: Tensor, centres: Tensor, inv_half: Tensor, values: Tensor,
            padding: Optional[Tensor]) -> TileBiasTables:
    return TileBiasTables(keys, centres, inv_half, values.size(-1), padding)


@torch.library.custom_op('cmt_aqr::tiled_bias_forward', mutates_args=())
def tiled_bias_forward(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, centres: Tensor, inv_half: Tensor,
                       amplitude: Tensor, values: Tensor, padding: Optional[Tensor],
                       scale: float) -> Tuple[Tensor, Tensor]:
    """Biased attention: the float32 output ``[bs, heads, Q, d]`` and log-sum-exp ``[bs, heads, Q]``."""
    from . import kernels
    return kernels.tiled_bias_forward(q, k, v, _tables(keys, centres, inv_half, values, padding), amplitude,
                                      values, scale)


@tiled_bias_forward.register_fake
def _(q, k, v, keys, centres, inv_half, amplitude, values, padding, scale):
    return q.new_empty(q.shape, dtype=torch.float32), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op('cmt_aqr::tiled_bias_backward', mutates_args=())
def tiled_bias_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, keys: Tensor,
                        centres: Tensor, inv_half: Tensor, amplitude: Tensor, values: Tensor,
                        padding: Optional[Tensor], scale: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """float32 ``dq``, ``dk``, ``dv`` and the bias terms' gradients ``[bs, heads, Q, G + S]``."""
    from . import kernels
    return kernels.tiled_bias_backward(grad_out, q, k, v, out, lse,
                                       _tables(keys, centres, inv_half, values, padding), amplitude, values, scale)


@tiled_bias_backward.register_fake
def _(grad_out, q, k, v, out, lse, keys, centres, inv_half, amplitude, values, padding, scale):
    terms = centres.size(0) + values.size(-1)
    return (q.new_empty(q.shape, dtype=torch.float32), k.new_empty(k.shape, dtype=torch.float32),
            v.new_empty(v.shape, dtype=torch.float32), q.new_empty((*q.shape[:3], terms), dtype=torch.float32))
