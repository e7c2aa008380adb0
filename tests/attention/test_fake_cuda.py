"""The CUDA paths of ``apply_attention``, traced on fake CUDA tensors (no GPU needed).

``FakeTensorMode`` makes ``device='cuda'`` tensors on a CPU-only machine and
runs the CUDA ops' meta kernels: shapes, dtypes, devices and op signatures are
checked, and any data-dependent shape or host synchronisation (``nonzero``,
boolean indexing, ``bool(t.any())``) raises. Autograd cannot run there (it
needs a CUDA context): the segment backward and the fused kernels' backward
ops are traced by calling them directly, and the gradients' values stay
verified by the CPU twins in ``test_backends.py``: the CUDA branch of each backend differs from its CPU
branch only in the kernel it calls (``fused_lse``: the CUDA flash / efficient
kernels; ``window_slots.SlotPattern``: the ``'gather'`` formulation instead of
``sampled_addmm`` / ``embedding_bag``, compared with it below and in
``test_window_slots_gather.py``; the exact recomputation: a budget
of rows instead of the exact count, tested on the CPU with the same code in
``test_exact_rows.py``).
"""
import importlib.util
import itertools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from projects.mmdet3d_plugin.attention import (AttentionBias, KeyGrid, SegmentBias, WindowBias, apply_attention,
                                               select_backend)
from projects.mmdet3d_plugin.attention import SlotPattern, dispatch
from projects.mmdet3d_plugin.attention.backends import UnsupportedAttentionError
from projects.mmdet3d_plugin.attention.backends.segment import backend as segment
from projects.mmdet3d_plugin.attention.dispatch import _make_call
from projects.mmdet3d_plugin.utils.host_data import HostCopyCounter

# the R50 shape of the default config: 900 queries, a 128 x 128 BEV grid and 6 views of 20 x 50 cells
BS, HEADS, NUM_QUERIES, HEAD_DIM = 2, 8, 900, 32
BEV = KeyGrid(0, 1, 128, 128)
CAMERA = KeyGrid(128 * 128, 6, 20, 50)
NUM_KEYS = BEV.end + CAMERA.num_cells
KINDS = ('none', 'global', 'local', 'both')
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: every backend auto may pick on CUDA (flex is never picked, see dispatch.py)
CUDA_BACKENDS = ('auto', 'segment', 'flashbias', 'sdpa', 'math')


#: heads of the bias: one, shared by the attention heads, as AttentionBiasGenerator builds it by default (a
#: ``[bs, 1, Q, K]`` dense mask for sdpa), and one per head (``per_head=True``)
BIAS_HEADS = (1, HEADS)


def _fake_problem(kind, dtype, bias_heads=1, bias_dtype=None):
    """q, k, v and an AQR-like bias of ``bias_heads`` heads on fake CUDA (call inside a FakeTensorMode); the bias in
    ``bias_dtype`` (default: q's)."""
    q, k, v = (torch.randn(BS, HEADS, n, HEAD_DIM, device='cuda', dtype=dtype, requires_grad=True)
               for n in (NUM_QUERIES, NUM_KEYS, NUM_KEYS))
    bias_dtype = bias_dtype or dtype
    parts = []
    if kind in ('global', 'both'):
        values = torch.randn(BS, bias_heads, NUM_QUERIES, 2, device='cuda', dtype=bias_dtype, requires_grad=True)
        parts.append(SegmentBias(values, [BEV.end, CAMERA.num_cells]))
    if kind in ('local', 'both'):
        centres = [torch.stack([torch.randint(0, n, (BS, NUM_QUERIES), device='cuda')
                                for n in (grid.planes, grid.height, grid.width)], -1) for grid in (BEV, CAMERA)]
        valid = [torch.ones(BS, NUM_QUERIES, dtype=torch.bool, device='cuda') for _ in range(2)]
        amplitudes = [torch.randn(BS, bias_heads, NUM_QUERIES, device='cuda', dtype=bias_dtype, requires_grad=True)
                      for _ in range(2)]
        parts.append(WindowBias([BEV, CAMERA], centres, valid, amplitudes, [7, 5]))
    return q, k, v, (AttentionBias(parts, NUM_KEYS) if parts else None)


def test_every_cuda_backend_traces_on_fake_cuda_or_refuses():
    """Each call returns a CUDA output of q's shape and dtype or raises UnsupportedAttentionError."""
    outcomes = {}
    with FakeTensorMode(allow_non_fake_inputs=True):
        for backend, kind, dtype, bias_heads in itertools.product(CUDA_BACKENDS, KINDS, DTYPES, BIAS_HEADS):
            q, k, v, bias = _fake_problem(kind, dtype, bias_heads)
            try:
                out = apply_attention(q, k, v, bias, backend=backend)
            except UnsupportedAttentionError:
                outcomes[backend, kind, dtype, bias_heads] = 'unsupported'
                continue
            assert (out.device.type, out.dtype, tuple(out.shape)) == ('cuda', dtype, tuple(q.shape)), \
                (backend, kind, dtype, bias_heads)
            outcomes[backend, kind, dtype, bias_heads] = 'ok'
    # auto, segment (fp32 included) and math run every case; flashbias refuses only the window bias, sdpa only
    # the gradient of a segment bias in half precision; the same for a bias shared by the heads and one per head
    refused = sorted((b, kind, str(d), h) for (b, kind, d, h), r in outcomes.items() if r == 'unsupported')
    assert refused == sorted([('flashbias', kind, str(d), h) for kind in ('local', 'both') for d in DTYPES
                              for h in BIAS_HEADS]
                             + [('sdpa', kind, str(d), h) for kind in ('global', 'both')
                                for d in (torch.float16, torch.bfloat16) for h in BIAS_HEADS])


#: every backend ``auto`` runs on CUDA (tiled_bias where Triton is installed, flash_attn where flash-attn is)
AUTO_CUDA_KERNELS = ('tiled_bias', 'segment', 'sdpa', 'flashbias', 'flash_attn')


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision_attention_takes_the_float32_bias_of_the_float32_head(dtype):
    """The published configs on CUDA: the head, so its AQR bias, in float32 and q, k, v in half precision
    (``PETRMultiheadFlashAttention(attention_dtype='auto')``). Every backend ``auto`` runs returns q's dtype or
    refuses for the reasons it gives a bias of q's dtype, and ``auto`` picks what it picks for that bias."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        for backend, kind in itertools.product(('auto', ) + AUTO_CUDA_KERNELS, KINDS):
            outcome = {}
            for bias_dtype in (torch.float32, dtype):
                q, k, v, bias = _fake_problem(kind, dtype, bias_dtype=bias_dtype)
                if bias is not None:
                    assert {t.dtype for p in bias.parts for t in p.tensors() if t.is_floating_point()} == {bias_dtype}
                try:
                    out = apply_attention(q, k, v, bias, backend=backend)
                    assert (out.device.type, out.dtype, tuple(out.shape)) == ('cuda', dtype, tuple(q.shape))
                    outcome[bias_dtype] = 'ok'
                except UnsupportedAttentionError as error:
                    outcome[bias_dtype] = str(error)
                if backend == 'auto':
                    outcome[bias_dtype, 'choice'] = select_backend(q, bias, k=k, v=v)[0]
            assert outcome[torch.float32] == outcome[dtype], (backend, kind, outcome)
            if backend == 'auto':
                assert outcome[torch.float32, 'choice'] == outcome[dtype, 'choice'], (kind, outcome)
                assert outcome[torch.float32] == 'ok'


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_the_kernels_backward_keeps_a_float32_bias_float32(dtype):
    """segment and tiled_bias read the bias in float32 (its gradient comes back float32) and q, k, v in half
    precision, backward traced on fake CUDA as above."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v, bias = _fake_problem('both', dtype, bias_dtype=torch.float32)
        _, _, grads, (segment_values, window_weight) = _segment_forward_and_backward(q, k, v, bias)
        assert [g.dtype for g in grads[:3]] == [dtype] * 3
        assert (segment_values.dtype, window_weight.dtype, grads[3].dtype, grads[4].dtype) == (torch.float32, ) * 4
        if importlib.util.find_spec('triton') is None:
            return
        from types import SimpleNamespace

        from projects.mmdet3d_plugin.attention.backends.tiled_bias.backend import TiledBiasBackend, TiledBiasFunction
        call = _make_call(q, k, v, bias, None, 0.0, None)
        tables, amplitude, values = TiledBiasBackend._tables(call)
        out = apply_attention(q, k, v, bias, backend='tiled_bias')
        ctx = SimpleNamespace(saved_tensors=(q, k, v, amplitude, values, q.float(), q[..., 0].float()),
                              tables=tables, scale=call.scale)
        grads = TiledBiasFunction.backward(ctx, torch.randn_like(out))
        assert [g.dtype for g in grads[:5]] == [dtype] * 3 + [torch.float32] * 2


def test_cuda_calls_copy_no_host_data_to_the_device():
    """No blocking host-to-device copy (a stream synchronisation on a GPU) in any call auto may run, forward and
    segment backward: constants come from the per-device cache, counts are built on the device."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        for backend, kind in itertools.product(CUDA_BACKENDS, KINDS):
            q, k, v, bias = _fake_problem(kind, torch.float16)
            with HostCopyCounter() as counter:
                try:
                    apply_attention(q, k, v, bias, backend=backend)
                except UnsupportedAttentionError:
                    continue
            assert counter.copies == [], (backend, kind, counter.copies)
        q, k, v, bias = _fake_problem('both', torch.float16)
        with HostCopyCounter() as counter:
            _segment_forward_and_backward(q, k, v, bias)
        assert counter.copies == []


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('structured_first', [{'cuda': 'tiled_bias'}, {}], ids=['default', 'size rule'])
def test_select_backend_on_cuda_is_the_documented_choice(dtype, structured_first, monkeypatch):
    """``auto`` on CUDA: every structured bias through ``tiled_bias`` (the default ``STRUCTURED_BIAS_FIRST``, where
    Triton is installed); beneath it the size rule, which a call ``tiled_bias`` cannot run takes."""
    assert dispatch.STRUCTURED_BIAS_FIRST == {'cuda': 'tiled_bias'}, 'the measured default (docs/gpu.md)'
    monkeypatch.setattr(dispatch, 'STRUCTURED_BIAS_FIRST', structured_first)
    # flash_attn only where the package is installed (the optional extra), else bias-free SDPA
    # the R50 shape (3.2e8 score elements) is below CUDA_DENSE_BIAS_MAX_ELEMENTS: a window bias runs dense sdpa,
    # unless a half-precision segment bias needs its gradient (sdpa refuses it)
    half = dtype != torch.float32
    expected = {'none': 'flash_attn' if importlib.util.find_spec('flash_attn') else 'sdpa', 'global': 'segment',
                'local': 'sdpa', 'both': 'segment' if half else 'sdpa'}
    if structured_first and importlib.util.find_spec('triton') is not None:
        expected.update({kind: 'tiled_bias' for kind in ('global', 'local', 'both')})
    with FakeTensorMode(allow_non_fake_inputs=True):
        for kind in KINDS:
            q, k, v, bias = _fake_problem(kind, dtype)
            name, _ = select_backend(q, bias, k=k, v=v)
            assert name == expected[kind], (kind, dtype, name)


def test_a_call_tiled_bias_cannot_run_falls_back_to_the_size_rule_and_says_why():
    """Dropout on the attention probabilities (``tiled_bias`` has none): the local bias at the R50 shape takes the
    size rule's dense sdpa, and the reason names the skipped backend."""
    pytest.importorskip('triton', reason='the triton package comes with the CUDA builds of torch that setup installs')
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v, bias = _fake_problem('local', torch.float32)
        assert select_backend(q, bias, k=k, v=v)[0] == 'tiled_bias'
        name, reason = select_backend(q, bias, dropout_p=0.1, k=k, v=v)
    assert name == 'sdpa' and 'skipped tiled_bias' in reason and 'dropout' in reason, reason


def test_gathered_slot_dot_equals_the_sampled_cpu_product(cases):
    """The CUDA ``SlotPattern.dot`` (gathered keys) equals the CPU one (``sampled_addmm``)."""
    bias, _ = cases.make_bias('window', bs=2, heads=3, num_queries=6)
    keys = bias.parts[0].window_keys()
    pattern = SlotPattern(keys.index, bias.num_keys, 3)
    q, k, _ = cases.make_qkv(requires_grad=False)
    torch.testing.assert_close(pattern.gathered_dot(q * 0.5, k), pattern.dot(q, k, 0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('dtype', DTYPES)
def test_cuda_fused_kernels_with_lse_and_their_backward_trace(dtype):
    """The CUDA kernels segment calls (flash for half precision, memory-efficient for float32), forward and backward.

    Autograd does not run on fake CUDA, so the backward ops are called directly, as the segment backward does.
    """
    from projects.mmdet3d_plugin.attention.backends.segment.fused_lse import (fused_attention_with_lse,
                                                                              fused_attention_with_lse_backward)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = (torch.randn(BS, HEADS, n, HEAD_DIM, device='cuda', dtype=dtype) for n in (NUM_QUERIES, 100, 100))
        out, lse, state = fused_attention_with_lse(q, k, v, None, 0.25)
        assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, dtype, (BS, HEADS, NUM_QUERIES),
                                                                torch.float32)
        grads = fused_attention_with_lse_backward(torch.randn_like(out), q, k, v, out, state, None, 0.25)
        assert [(g.shape, g.dtype, g.device.type) for g in grads] == [(t.shape, dtype, 'cuda') for t in (q, k, v)]


class _Context:
    """The parts of an autograd context ``SegmentAttentionFunction`` uses, for calling it without autograd."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        pass


def _segment_forward_and_backward(q, k, v, bias):
    """The segment function's forward and backward called without autograd: output, retained shares, gradients
    and the bias tensors it is differentiable in."""
    call = _make_call(q, k, v, bias, None, 0.0, None)
    plan, segment_values, window_weight = segment.SegmentBackend._plan(call)
    ctx = _Context((True, ) * 5 + (False, ))
    out, retained = segment.SegmentAttentionFunction.forward(ctx, q.detach(), k.detach(), v.detach(),
                                                             segment_values.detach(), window_weight.detach(), plan)
    grads = segment.SegmentAttentionFunction.backward(ctx, torch.randn_like(out), None)
    return out, retained, grads, (segment_values, window_weight)


@pytest.mark.parametrize('dtype', DTYPES)
def test_segment_backward_traces_on_fake_cuda(dtype):
    """The whole segment backward (segment merge + window correction) on fake CUDA, called without autograd."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v, bias = _fake_problem('both', dtype)
        out, retained, grads, (segment_values, window_weight) = _segment_forward_and_backward(q, k, v, bias)
        assert (retained.shape, retained.dtype) == ((BS, HEADS, NUM_QUERIES), torch.float32)
        assert [(g.shape, g.dtype, g.device.type) for g in grads[:3]] == [(t.shape, dtype, 'cuda') for t in (q, k, v)]
        assert grads[3].shape == segment_values.shape and grads[4].shape == window_weight.shape


def test_tiled_bias_traces_on_fake_cuda_forward_and_backward(monkeypatch):
    """``tiled_bias`` (``auto`` runs it where ``STRUCTURED_BIAS_FIRST`` names it) on fake CUDA at the R50 shape: every
    bias kind, dtype and bias head count; its backward through the Function's own code (autograd does not run on
    fake CUDA); no host copy. Its values are checked on the CPU under Triton's interpreter (test_tiled_bias.py)."""
    pytest.importorskip('triton', reason='the triton package comes with the CUDA builds of torch that setup installs')
    from types import SimpleNamespace

    from projects.mmdet3d_plugin.attention.backends.tiled_bias.backend import TiledBiasBackend, TiledBiasFunction
    monkeypatch.setattr(dispatch, 'STRUCTURED_BIAS_FIRST', {'cuda': 'tiled_bias'})
    with FakeTensorMode(allow_non_fake_inputs=True):
        for kind, dtype, bias_heads in itertools.product(KINDS, DTYPES, BIAS_HEADS):
            q, k, v, bias = _fake_problem(kind, dtype, bias_heads)
            expected = 'tiled_bias' if bias is not None else select_backend(q, None, k=k, v=v)[0]
            assert select_backend(q, bias, k=k, v=v)[0] == expected
            with HostCopyCounter() as counter:
                out = apply_attention(q, k, v, bias, backend='tiled_bias')
                call = _make_call(q, k, v, bias, None, 0.0, None)
                tables, amplitude, values = TiledBiasBackend._tables(call)
                ctx = SimpleNamespace(saved_tensors=(q, k, v, amplitude, values, q.float(), q[..., 0].float()),
                                      tables=tables, scale=call.scale)
                grads = TiledBiasFunction.backward(ctx, torch.randn_like(out))
            assert counter.copies == [], (kind, dtype, counter.copies)
            assert (out.device.type, out.dtype, tuple(out.shape)) == ('cuda', dtype, tuple(q.shape))
            for grad, tensor in zip(grads[:5], (q, k, v, amplitude, values)):
                assert (grad.dtype, grad.shape) == (tensor.dtype, tensor.shape), (kind, dtype, bias_heads)
            assert amplitude.shape[:3] == ((0, BS, 1) if kind in ('none', 'global') else (2, BS, bias_heads))
            assert values.shape[1:] == ((1, NUM_QUERIES, 0) if kind in ('none', 'local')
                                        else (bias_heads, NUM_QUERIES, 2))
