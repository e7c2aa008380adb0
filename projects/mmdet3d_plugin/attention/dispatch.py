"""One entry point for biased multi-head attention: :func:`apply_attention`.

``backend='auto'`` takes the first backend of a per-device preference list
that can apply the given bias exactly and logs, once per kind of call, which
one runs and why (logger ``'mmdet'``, so it lands in mmdet's log). An
explicitly named backend that cannot apply the call raises
:class:`~.backends.UnsupportedAttentionError` listing the reasons.

Preference (fastest exact first):

* no bias or only dense masks: CUDA ``flash_attn`` (no mask), ``sdpa``;
  CPU ``sdpa``;
* structured bias on CPU, small calls (``bs * heads * Q * K`` at most
  :data:`DENSE_BIAS_MAX_ELEMENTS`, per bias kind and pass): ``sdpa`` with the
  bias densified (``segment``'s fixed cost per call outweighs the dense bias
  there; measured, see the constant);
* structured bias on CPU, larger calls: ``segment`` (segment and window
  biases), then ``flashbias`` (low-rank biases, and calls with dropout), ``sdpa``;
* structured bias on CUDA: ``tiled_bias`` first (:data:`STRUCTURED_BIAS_FIRST`:
  the bias computed inside the tiles of its Triton kernels, measured fastest
  on an H200); where it cannot run a call (no Triton, a GPU older than Ampere,
  dropout on the attention probabilities, a head dim above 128, a dense or
  low-rank part) a local (window) bias through dense ``sdpa`` while
  ``bs * heads * Q * K`` is at most
  :data:`CUDA_DENSE_BIAS_MAX_ELEMENTS`, else ``segment``, ``flashbias``,
  ``sdpa``; the global bias alone takes ``segment`` at every size.

Every list holds only exact backends, so choosing by size never drops a bias
or runs an inexact path; :func:`select_backend` says which backend ``auto``
runs and why (the reason names the size, the threshold and its key).

``tiled_bias`` runs first only where :data:`STRUCTURED_BIAS_FIRST` names it
for the device type: CUDA by default; on the CPU it needs Triton's
interpreter, far slower than ``segment`` (the benchmarks' ``--prefer-backend``
names any backend, for a measurement).

``flex`` is never picked by ``auto``: a compiled ``score_mod`` that captures
learned bias tensors has unverified gradients (pytorch/pytorch#162228) and
shapes that were never traced here; it runs only when named explicitly.
Every backend ``auto`` can pick on CUDA is traced on fake CUDA tensors by
``tests/attention/test_fake_cuda.py``.

``math`` (the fp32 reference) ends every list.
"""
import logging
import re
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .backends import BACKENDS, AttentionCall
from .bias import AttentionBias, BiasPart, as_attention_bias

BiasLike = Union[None, Tensor, BiasPart, AttentionBias]

logger = logging.getLogger('mmdet')
_LOGGED = set()

#: structured bias, calls above the size threshold (and every call off SIZE_RULE_DEVICES): fastest exact first
LARGE_ORDER = ('segment', 'flashbias', 'sdpa', 'math')
#: structured bias, calls at most the size threshold: the bias densified (exact for every bias, mask and dropout,
#: except a differentiable segment bias in half precision, which sdpa refuses), then the large order
SMALL_ORDER = ('sdpa', ) + tuple(name for name in LARGE_ORDER if name != 'sdpa')
#: the size rule: ``auto`` runs a structured bias through dense ``sdpa`` while the score matrix,
#: ``bs * heads * Q * K`` elements, is at most this, per (bias kind, pass): ``'window'`` where the bias has a
#: :class:`WindowBias` part (the local AQR bias), else ``'segment'`` (the global one); ``'fwdbwd'`` where autograd
#: will differentiate the call, else ``'fwd'``. Above it ``segment`` (then ``flashbias``, ``sdpa``) as before.
#: ``segment`` has a fixed cost per call (a fused kernel per key segment, the merge, the window slots, its custom
#: backward) that only pays off against the dense bias, whose cost grows with ``Q * K``, beyond these sizes.
#: Measured with ``tools/benchmark_attention.py --crossover`` (CPU fp32, 1 thread of a shared 2-core machine, 12
#: queries x 312 keys up to R50's 900 x 22 384, table in docs/attention.md "auto by size"): dense sdpa is faster
#: than segment up to about 6e4 (global bias, fwd+bwd), 2.5e5 (global, fwd), 1e6 (local, fwd+bwd) and 2e6 to 9e6
#: (local, fwd) elements; each threshold is the power of two nearest its crossover. E.g. local fwd+bwd: 12 x 312
#: keys (2 heads): segment 12.1x bias-free SDPA, sdpa 4.95x; 50 x 1 456 (4 heads): 1.99x vs 1.48x; 100 x 1 456:
#: 1.34x vs 1.76x. Near a threshold the two differ by less than the measurement's spread (~10 %).
DENSE_BIAS_MAX_ELEMENTS = {
    ('segment', 'fwd'): 2**18,  # 262 144
    ('segment', 'fwdbwd'): 2**16,  # 65 536
    ('window', 'fwd'): 2**22,  # 4 194 304
    ('window', 'fwdbwd'): 2**20,  # 1 048 576
}
#: the size rule on CUDA, the local (window) bias only: measured on an NVIDIA H200 (torch 2.11, ``tools/
#: benchmark_attention.py --crossover --device cuda``, table in docs/attention.md). Dense sdpa's cost grows with
#: ``Q * K`` while ``segment`` pays a fixed cost per call and its window correction. fwd+bwd, 900 queries: sdpa
#: 7.7-8.9x bias-free SDPA where segment is 26-29x (R50 keys, batch 1, float16: 1.6e8 elements), 10.8x vs 22.7x
#: (R50, batch 2, float16: 3.2e8), but 17.2x vs 11.9x at VoV's 56 400 keys (batch 1, float16: 4.1e8) and 21.0x
#: vs 9.5x (batch 2: 8.1e8); at the demo's sizes sdpa costs half of segment (5-10x vs 11-25x). The threshold lies
#: between 3.2e8 and 4.1e8: 3 * 2**27. Forward only, sdpa was as fast or faster at every measured size (VoV batch
#: 1: 4.0x vs 4.2x, batch 2: 4.7x vs 6.5x), so up to the largest measured, 8.1e8 (2**30; its dense float16 bias
#: takes 2 GiB there).
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
#: changes it (``tools/benchmark_*.py --prefer-backend``). CUDA: ``tiled_bias``, measured on an NVIDIA H200 (torch
#: 2.11, float32, 900 queries, docs/gpu.md "Fourth run"): fwd+bwd 0.43-0.65x bias-free SDPA for the global and the
#: local bias at R50 and VoV, batch 1 and 2, where segment took 0.75-1.69x and dense sdpa 1.10-1.51x; forward
#: alone 0.74-1.51x (dense sdpa 1.23-1.38x, segment 1.04-2.73x); every whole-model row faster than with the size
#: rule's choices (e.g. VoV training step 0.886x CMT instead of 1.172x), its accuracy rows in ``check_gpu`` ok
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
        backend (str): ``'auto'``, ``'math'``, ``'sdpa'``, ``'segment'``,
            ``'flashbias'``, ``'flex'`` or ``'flash_attn'``.
        dropout_p (float): dropout on the attention probabilities (pass 0
            outside training).
        scale (float, optional): multiplier of ``q k^T``; default ``d ** -0.5``.
        prefer (str, optional): with ``backend='auto'``, a backend tried before
            the preference list (``'flashbias'`` for ``use_flashbias=True``);
            when it cannot apply the call exactly, the log line says why and
            ``auto``'s choice runs.

    Returns:
        Tensor: ``[bs, heads, Q, d]`` in q's dtype. A query whose keys are all
        blocked gets 0.

    Raises:
        ValueError: shapes, dtypes or devices disagree (the message names
            them); ``UnsupportedAttentionError`` (a ValueError) when the named
            backend cannot apply the bias, mask or dropout.
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
    return BACKENDS[backend](call)
