"""The dtype cross-attention computes in: :func:`attention_compute_dtype`, a pure decision.

The option (``PETRMultiheadFlashAttention(attention_dtype=...)``, ``tools/benchmark_model.py
--attention-dtype``) is one of :data:`ATTENTION_DTYPES`. ``'auto'`` is upstream CMT's precision:
its flash cross-attention casts queries, keys and values to float16 after the float32
in-projections and returns float32, on CUDA; so ``'auto'`` is float16 for float32 inputs on
CUDA and the input dtype elsewhere (the CPU computes in float32: same bits as without the
option). A named dtype is used on every device.

Autocast: where ``torch.autocast`` is on for the device, the in-projections already run in
autocast's dtype and SDPA would be cast back by it: nothing is cast, autocast decides (the
option has no effect). mmcv's fp16 (``CustomFp16OptimizerHook``) keeps the head in float32
with autocast off (``pts_bbox_head=False``; the detector's head calls are ``force_fp32``),
so there the option decides.

The AQR bias keeps its own dtype (float32 from the float32 head; half only where
``AttentionBiasGenerator(fp16=True)`` sees half features). It is a few numbers per query
(segment values, window amplitudes): ``tiled_bias`` and ``segment`` read them in float32 and
add them to scores accumulated in float32, so rounding them to half first would only lose
accuracy and save nothing; ``sdpa`` (a dense mask) and ``flashbias`` (factors concatenated
to q and k) convert them to q's dtype where their kernels need one dtype.
"""
import torch

#: option -> the dtype it names (``'auto'``: decided per call, see :func:`attention_compute_dtype`)
ATTENTION_DTYPES = {'auto': None, 'float16': torch.float16, 'bfloat16': torch.bfloat16, 'float32': torch.float32}


def check_attention_dtype(option: str) -> str:
    """``option`` if it is one of :data:`ATTENTION_DTYPES`, else a ValueError naming the allowed values."""
    if option not in ATTENTION_DTYPES:
        raise ValueError(f'attention_dtype must be one of {list(ATTENTION_DTYPES)}, got {option!r}')
    return option


def attention_compute_dtype(option: str, device_type: str, input_dtype: torch.dtype,
                            autocast: bool = False) -> torch.dtype:
    """The dtype q, k and v are cast to before the attention kernel (``input_dtype``: no cast).

    Args:
        option (str): one of :data:`ATTENTION_DTYPES`.
        device_type (str): ``'cuda'``, ``'cpu'``, ...
        input_dtype (torch.dtype): dtype of the in-projections' output.
        autocast (bool): ``torch.autocast`` is on for ``device_type``.

    Returns:
        torch.dtype: float16 for ``'auto'`` with float32 inputs on CUDA, the
        named dtype for a named option, else ``input_dtype``.
    """
    named = ATTENTION_DTYPES[check_attention_dtype(option)]
    if autocast:
        return input_dtype
    if named is not None:
        return named
    return torch.float16 if device_type == 'cuda' and input_dtype == torch.float32 else input_dtype
