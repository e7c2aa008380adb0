"""One entry point for biased multi-head attention: :func:`apply_attention`.

It takes ``q`` ``[bs, heads, Q, d]``, ``k`` and ``v`` ``[bs, heads, K, d]`` and a bias
(a tensor broadcastable to ``[bs, heads, Q, K]`` or an :class:`AttentionBias`) and returns
``[bs, heads, Q, d]``. ``backend='auto'`` runs the first backend of a per-device
preference list that can apply the call exactly and logs, once per kind of call, which
one runs and why (logger ``'mmdet'``); :func:`select_backend` returns that choice. A
named backend that cannot apply the call raises
:class:`~.backends.UnsupportedAttentionError` listing the reasons.

Preference lists (only exact backends, each ending with ``math``, the fp32 reference):

* no structured bias: CUDA ``flash_attn`` (no mask), ``sdpa``; elsewhere ``sdpa``;
* structured bias, ``bs * heads * Q * K`` at most the device's size rule
  (:func:`size_rule`; on CUDA for the local window bias only): ``sdpa`` with the bias
  densified, where ``segment``'s fixed cost per call outweighs the dense bias;
* structured bias, larger calls or no size rule: ``segment``, ``flashbias``, ``sdpa``;
* before either, the device's :data:`STRUCTURED_BIAS_FIRST` (CUDA: ``tiled_bias``, the
  bias computed inside the tiles of Triton kernels); where it cannot run a call (no
  Triton, a GPU older than Ampere, dropout, a head dim above 128, a dense or low-rank
  part) the log line says why and the list runs.

``flex`` is never picked by ``auto``: a compiled ``score_mod`` that captures learned bias
tensors has unverified gradients (pytorch/pytorch#162228); it runs only when named.
:func:`recorded_backends` counts the backend and dtype of every call while it is open.
"""
import contextlib
import logging
import re
from collections import Counter
from typing import Iterator, List, Optional, Tuple, Union

import torch
from torch import Tensor

from .backends import BACKENDS, AttentionCall
from .bias import AttentionBias, BiasPart, as_attention_bias

BiasLike = Union[None, Tensor, BiasPart, AttentionBias]

logger = logging.getLogger('mmdet')
_LOGGED = set()
_RECORDS: List[Counter] = []

#: structured bias, calls above the size threshold (and every call off SIZE_RULE_DEVICES): fastest exact first
LARGE_ORDER = ('segment', 'flashbias', 'sdpa', 'math')
#: structured bias, calls at most the size threshold: the bias densified (exact for every bias, mask and dropout,
#: except a differentiable segment bias in half precision, which sdpa refuses), then the large order
SMALL_ORDER = ('sdpa', ) + tuple(name for name in LARGE_ORDER if name != 'sdpa')
#: the size rule: ``auto`` runs a structured bias through dense ``sdpa`` while the score matrix,
#: ``bs * heads * Q * K`` elements, is at most this, per (bias kind, pass): ``'window'`` where the bias has a
#: :class:`WindowBias` part (the local AQR bias), else ``'segment'`` (the global one); ``'fwdbwd'`` where autograd
#: will differentiate the call, else ``'fwd'``. Above it :data:`LARGE_ORDER` runs.
#: ``segment`` has a fixed cost per call (a fused kernel per key segment, the merge, the window slots, its custom
#: backward) that only pays off against the dense bias, whose cost grows with ``Q * K``, beyond these sizes.
#: Each threshold is the power of two nearest the CPU crossover of dense sdpa and segment found by
#: ``tools/benchmark_attention.py --crossover`` (see docs/results.md).
DENSE_BIAS_MAX_ELEMENTS = {
    ('segment', 'fwd'): 2**18,  # 262 144
    ('segment', 'fwdbwd'): 2**16,  # 65 536
    ('window', 'fwd'): 2**22,  # 4 194 304
    ('window', 'fwdbwd'): 2**20,  # 1 048 576
}
#: the size rule on CUDA, the local (window) bias only: dense sdpa's cost grows with ``Q * K`` while ``segment``
#: pays a fixed cost per call and its window correction. fwd+bwd: the threshold is the GPU crossover of the two,
#: between the R50 (batch 2) and VoV (batch 1) score sizes (``tools/benchmark_attention.py --crossover --device
#: cuda``, see docs/results.md); forward only, dense sdpa is at least as fast as segment up to the largest size
#: benchmarked (VoV, batch 2), hence 2**30 (its dense float16 bias takes 2 GiB).
#: The global bias has no rule on CUDA (segment first): sdpa cannot differentiate it in half precision, and in
#: float32 the faster of segment and sdpa changes with K rather than with the product.
CUDA_DENSE_BIAS_MAX_ELEMENTS = {
    ('window', 'fwd'): 2**30,  # 1 073 741 824
    ('window', 'fwdbwd'): 3 * 2**27,  # 402 653 184
}
#: device types with a size rule (:func:`size_rule`); elsewhere ``auto`` keeps ``segment`` first at every size
SIZE_RULE_DEVICES = ('cpu', 'cuda')
#: per device type, the backend ``auto`` tries first for every call with a structured bias (before the size rule's
#: list; when it cannot run a call, the log line says why and the list runs); :func:`set_structured_bias_first`
#: changes it (``tools/benchmark_*.py --prefer-backend``). CUDA: ``tiled_bias``, faster than ``segment`` and dense
#: ``sdpa`` on the GPU for the global and the local bias at R50 and VoV sizes, in training (fwd+bwd) and in every
#: whole-model benchmark, with its accuracy checked by ``check_gpu`` (see docs/results.md)
STRUCTURED_BIAS_FIRST = {'cuda': 'tiled_bias'}


def set_structured_bias_first(device_type: str, backend: str) -> None:
    """Make ``auto`` try ``backend`` first for structured biases on ``device_type`` (:data:`STRUCTURED_BIAS_FIRST`)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend '{backend}'; choose from {list(BACKENDS)}")
    STRUCTURED_BIAS_FIRST[device_type] = backend


def size_rule(device_type: str) -> Tuple[str, dict]:
    """The name and thresholds of the size rule on ``device_type`` (empty where there is none)."""
    if device_type == 'cpu':
        return 'DENSE_BIAS_MAX_ELEMENTS', DENSE_BIAS_MAX_ELEMENTS
    if device_type == 'cuda':
        return 'CUDA_DENSE_BIAS_MAX_ELEMENTS', CUDA_DENSE_BIAS_MAX_ELEMENTS
    return '', {}


def dense_elements(call: AttentionCall) -> int:
    """``bs * heads * Q * K``: the elements of the score matrix a dense bias is applied to."""
    bs, heads, num_queries, _ = call.q.shape
    num_keys = _num_keys(call.k, call.key_padding_mask)
    if num_keys is None:
        num_keys = call.bias.num_keys if call.bias is not None else 0
    return bs * heads * num_queries * num_keys


def size_rule_key(call: AttentionCall) -> Tuple[str, str]:
    """The key of :data:`DENSE_BIAS_MAX_ELEMENTS` that applies to ``call``: (``'window'`` | ``'segment'``,
    ``'fwdbwd'`` | ``'fwd'``)."""
    window = call.bias is not None and any(part.is_window for part in call.bias.parts)
    return ('window' if window else 'segment'), ('fwdbwd' if call.needs_grad else 'fwd')


def _auto_order(call: AttentionCall) -> Tuple[Tuple[str, ...], str]:
    """The preference list for ``call`` and why it is that list."""
    structured = call.bias is not None and any(part.is_structured for part in call.bias.parts)
    if not structured:
        return (('flash_attn', 'sdpa', 'math') if call.device_type == 'cuda' else ('sdpa', 'math')), \
            'no structured bias'
    order, why = _structured_order(call)
    first = STRUCTURED_BIAS_FIRST.get(call.device_type)
    if first is None:
        return order, why
    return (first, ) + tuple(name for name in order if name != first), \
        f'{why}; {first} first for structured biases on {call.device_type} (STRUCTURED_BIAS_FIRST)'


def _structured_order(call: AttentionCall) -> Tuple[Tuple[str, ...], str]:
    """The size rule's preference list for a call with a structured bias, and why."""
    rule, thresholds = size_rule(call.device_type)
    key = size_rule_key(call)
    if key not in thresholds:
        return LARGE_ORDER, (f'no size rule on {call.device_type} for {list(key)} (measured: '
                             f'{", ".join(f"{device} {list(size_rule(device)[1])}" for device in SIZE_RULE_DEVICES)})')
    threshold, elements = thresholds[key], dense_elements(call)
    size = f'bs*heads*Q*K = {elements} {"<=" if elements <= threshold else ">"} {rule}{list(key)} = ' \
        f'{threshold} on {call.device_type}'
    if elements <= threshold:
        return SMALL_ORDER, size + ": dense sdpa costs less than segment's fixed cost per call"
    return LARGE_ORDER, size


def _choose(call: AttentionCall, prefer: Optional[str] = None) -> Tuple[str, str]:
    order, why = _auto_order(call)
    if prefer is not None:
        order = (prefer, ) + tuple(name for name in order if name != prefer)
        why += f'; {prefer} preferred'
    skipped = []
    for name in order:
        reasons = BACKENDS[name].not_supported_reasons(call)
        if not reasons:
            reason = f'{why}: first of {list(order)} on {call.device_type} that can apply it exactly'
            if skipped:
                reason += '; skipped ' + '; '.join(skipped)
            return name, reason
        skipped.append(f'{name} ({", ".join(reasons)})')
    raise RuntimeError(f'no attention backend can run {call.describe()}: ' + '; '.join(skipped))


def _num_keys(k: Optional[Tensor], key_padding_mask: Optional[Tensor]) -> Optional[int]:
    if k is not None:
        return k.size(2)
    if key_padding_mask is not None:
        return key_padding_mask.size(-1)
    return None


def _make_call(q: Tensor, k: Optional[Tensor], v: Optional[Tensor], bias: BiasLike,
               key_padding_mask: Optional[Tensor], dropout_p: float, scale: Optional[float]) -> AttentionCall:
    """Validate the arguments of :func:`apply_attention` and bundle them."""
    for name, tensor in (('q', q), ('k', k), ('v', v)):
        if tensor is None:
            continue
        if not isinstance(tensor, Tensor) or tensor.dim() != 4 or not tensor.is_floating_point():
            raise ValueError(f'{name} must be a float tensor [bs, heads, L, d], got '
                             f'{tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__}')
        if tensor.dtype != q.dtype or tensor.device != q.device:
            raise ValueError(f'{name} is {tensor.dtype} on {tensor.device}, q is {q.dtype} on {q.device}')
    bs, heads, num_queries, head_dim = q.shape
    if k is not None and v is not None:
        if k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2] or k.size(2) != v.size(2):
            raise ValueError(f'q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must be '
                             '[bs, heads, Q, d], [bs, heads, K, d], [bs, heads, K, d]')
        if k.size(-1) != head_dim or v.size(-1) != head_dim:
            raise ValueError(f'q, k and v must share the head dim, got {head_dim}, {k.size(-1)}, {v.size(-1)}')
        if k.size(2) == 0:
            raise ValueError('attention over zero keys')
    num_keys = _num_keys(k, key_padding_mask)
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            raise ValueError('key_padding_mask must be a bool tensor [bs, K] (True = padding)')
        if tuple(key_padding_mask.shape) != (bs, num_keys) or key_padding_mask.device != q.device:
            raise ValueError(f'key_padding_mask must be [bs, K] = {(bs, num_keys)} on {q.device}, got '
                             f'{tuple(key_padding_mask.shape)} on {key_padding_mask.device}')
    bias = as_attention_bias(bias, num_keys)
    if bias is not None:
        bias.check(bs, heads, num_queries, num_keys if num_keys is not None else bias.num_keys)
        for part in bias.parts:
            if part.device != q.device:
                raise ValueError(f'{part.describe()} is on {part.device}, q is on {q.device}')
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f'dropout_p must be in [0, 1), got {dropout_p}')
    scale = float(scale) if scale is not None else head_dim ** -0.5
    return AttentionCall(q, k, v, bias, key_padding_mask, float(dropout_p), scale)


def select_backend(q: Tensor,
                   bias: BiasLike = None,
                   key_padding_mask: Optional[Tensor] = None,
                   dropout_p: float = 0.0,
                   *,
                   k: Optional[Tensor] = None,
                   v: Optional[Tensor] = None) -> Tuple[str, str]:
    """The backend ``apply_attention(..., backend='auto')`` would run, and why.

    Args:
        q (Tensor): ``[bs, heads, Q, d]``.
        bias: as in :func:`apply_attention`.
        key_padding_mask (Tensor, optional): ``[bs, K]`` bool.
        dropout_p (float): attention dropout.
        k, v (Tensor, optional): keys and values (whether they require grad
            matters for ``flex`` on CPU).

    Returns:
        tuple[str, str]: backend name and the reason.
    """
    return _choose(_make_call(q, k, v, bias, key_padding_mask, dropout_p, None))


def _log_once(name: str, call: AttentionCall, reason: str) -> None:
    parts = tuple(type(p).__name__ for p in call.bias.parts) if call.bias is not None else ()
    # sizes left out: one line per kind of call, not per query count (DN queries vary from step to step)
    key = (name, parts, call.device_type, call.q.dtype, call.key_padding_mask is not None, call.dropout_p > 0,
           re.sub(r'\d+', 'N', reason))
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.info(f"apply_attention: backend '{name}' for {call.describe()}: {reason}")


@contextlib.contextmanager
def recorded_backends() -> Iterator[Counter]:
    """While open, count ``(backend, q's dtype name)`` of every :func:`apply_attention` call (e.g.
    ``('tiled_bias', 'float16')``): the kernel and precision a model run used (``tools/benchmark_model.py``)."""
    record = Counter()
    _RECORDS.append(record)
    try:
        yield record
    finally:
        _RECORDS.remove(record)


def apply_attention(q: Tensor,
                    k: Tensor,
                    v: Tensor,
                    bias: BiasLike = None,
                    key_padding_mask: Optional[Tensor] = None,
                    backend: str = 'auto',
                    dropout_p: float = 0.0,
                    scale: Optional[float] = None,
                    prefer: Optional[str] = None) -> Tensor:
    """Multi-head attention ``softmax(q k^T * scale + bias) v`` with an exactly applied bias.

    Args:
        q (Tensor): ``[bs, heads, Q, d]``.
        k (Tensor): ``[bs, heads, K, d]``.
        v (Tensor): ``[bs, heads, K, d]``.
        bias (None | Tensor | BiasPart | AttentionBias): a tensor broadcastable
            to ``[bs, heads, Q, K]`` (bool: True = blocked; float: added to the
            scores), or a structured bias.
        key_padding_mask (Tensor, optional): ``[bs, K]`` bool, True = padding.
        backend (str): ``'auto'`` (see the module docstring) or the name of
            a registered backend (``BACKENDS``).
            Backends: `auto`, `math`, `sdpa`, `segment`, `flashbias`, `flex`, `flash_attn`, `tiled_bias`.
        dropout_p (float): dropout on the attention probabilities (pass 0
            outside training).
        scale (float, optional): multiplier of ``q k^T``; default ``d ** -0.5``.
        prefer (str, optional): with ``backend='auto'``, a backend tried before
            the preference list; when it cannot apply the call exactly, the log
            line says why and ``auto``'s choice runs.

    Returns:
        Tensor: ``[bs, heads, Q, d]`` in q's dtype. A query whose keys are all
        blocked gets 0.

    Raises:
        ValueError: an unknown ``backend`` or ``prefer``, ``prefer`` without
            ``backend='auto'``, or shapes, dtypes or devices that disagree (the
            message names them); ``UnsupportedAttentionError`` (a ValueError)
            when the named backend cannot apply the bias, mask or dropout.
        RuntimeError: with ``backend='auto'``, no backend can run the call.
    """
    if backend != 'auto' and backend not in BACKENDS:
        raise ValueError(f"unknown attention backend '{backend}'; choose from {['auto'] + list(BACKENDS)}")
    if prefer is not None and (backend != 'auto' or prefer not in BACKENDS):
        raise ValueError(f"prefer={prefer!r} needs backend='auto' and a backend of {list(BACKENDS)}, got "
                         f"backend={backend!r}")
    call = _make_call(q, k, v, bias, key_padding_mask, dropout_p, scale)
    if backend == 'auto':
        backend, reason = _choose(call, prefer)
    else:
        reason = 'set explicitly'
    _log_once(backend, call, reason)
    for record in _RECORDS:
        record[backend, str(q.dtype).replace('torch.', '')] += 1
    return BACKENDS[backend](call)
