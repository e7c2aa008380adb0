"""Checks of the ``tiled_bias`` Triton kernels under Triton's interpreter, run by ``test_tiled_bias.py``.

Not collected by the suite (no ``test_`` prefix): the interpreter must be on
(``TRITON_INTERPRET=1``) before Triton is first imported, so
``test_tiled_bias.py`` runs this module in a pytest process of its own with
the variable set. The backend runs on CPU tensors against ``math``: outputs
and the gradients of q, k, v, the segment values and the window amplitudes
(per head and shared by the heads), for no bias, the global, the local and
both biases; blocks smaller than the problem (query and key tails, a key tile
straddling the BEV and camera grids); key padding with a segment and a whole
sample padded; split-head strided inputs, an odd head dim, a custom scale;
several segment biases; half precision (with a float32 and a half bias); a bias-only gradient; the custom
operators' fake implementations against the kernels (``torch.library.opcheck``); a whole detector's training step
(the demo CMT-AQR, one decoder layer) against ``auto``'s.
"""
import os

import pytest
import torch

from projects.mmdet3d_plugin.attention import AttentionBias, SegmentBias, apply_attention
from projects.mmdet3d_plugin.attention.backends.tiled_bias import launch
from test_backends import FP32_TOLERANCE, LOW_PRECISION_TOLERANCE, _outputs_and_grads, assert_matches_math

if os.environ.get('TRITON_INTERPRET') != '1':
    raise RuntimeError('run with TRITON_INTERPRET=1 (test_tiled_bias.py does)')


@pytest.mark.parametrize('bias_heads', [1, 3])
@pytest.mark.parametrize('kind', ['none', 'segment', 'window', 'segment+window'])
def test_matches_math(cases, kind, bias_heads):
    q, k, v = cases.make_qkv()
    bias, leaves = (None, []) if kind == 'none' else cases.make_bias(kind, bias_heads=bias_heads)
    assert_matches_math(cases, 'tiled_bias', q, k, v, bias, leaves, FP32_TOLERANCE)


def test_blocks_smaller_than_the_problem(cases, monkeypatch):
    """40 queries in blocks of 16 (a tail of 8) and 85 keys in tiles of 16: tiles straddle the BEV / camera grid
    boundary (key 35) and the last key tile holds the two keys on no grid and the padding past K."""
    for kernel in ('forward', 'key_grad', 'query_grad'):
        monkeypatch.setitem(launch.LAUNCH, (kernel, 'float32'), launch.Launch(16, 16, 4))
    q, k, v = cases.make_qkv(num_queries=40)
    bias, leaves = cases.make_bias('segment+window', num_queries=40, bias_heads=3)
    assert_matches_math(cases, 'tiled_bias', q, k, v, bias, leaves, FP32_TOLERANCE)


def test_key_padding_mask(cases):
    """Padding inside windows, the BEV segment all padding for one sample, and a sample with every key padded."""
    q, k, v = cases.make_qkv(bs=3)
    bias, leaves = cases.make_bias('segment+window', bs=3)
    padding = torch.rand(3, cases.NUM_KEYS) < 0.3
    padding[1, :35] = True
    padding[2] = True
    assert_matches_math(cases, 'tiled_bias', q, k, v, bias, leaves, FP32_TOLERANCE, key_padding_mask=padding)
    out, grads = _outputs_and_grads(q, k, v, bias, leaves, 'tiled_bias', key_padding_mask=padding)
    assert (out[2] == 0).all()
    assert all(torch.isfinite(g).all() for g in grads if g is not None)


def test_split_head_views_odd_head_dim_single_query_and_scale(cases):
    """q, k, v as the attention module passes them (views of ``[bs, L, heads, d]``), d = 12, one query."""
    q, k, v = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
               for t in cases.make_qkv(bs=1, heads=2, num_queries=1, dim=12))
    assert not k.is_contiguous()
    bias, leaves = cases.make_bias('segment+window', bs=1, heads=2, num_queries=1)
    assert_matches_math(cases, 'tiled_bias', q, k, v, bias, leaves, FP32_TOLERANCE, scale=0.3)


def test_several_segment_biases_and_strong_windows(cases):
    """Two segment biases (refined to four segments) and amplitudes large enough to dominate their rows."""
    q, k, v = cases.make_qkv()
    window, amplitudes = cases.make_window(2, 3, 6, amplitude_scale=8.0)
    coarse = torch.randn(2, 1, 6, 2, requires_grad=True)
    fine = torch.randn(2, 3, 6, 3, requires_grad=True)
    bias = AttentionBias([SegmentBias(coarse, cases.SEGMENTS), SegmentBias(fine, (10, 60, 15)), window],
                         cases.NUM_KEYS)
    assert_matches_math(cases, 'tiled_bias', q, k, v, bias, [coarse, fine] + amplitudes, FP32_TOLERANCE)


@pytest.mark.parametrize('bias_in_q_dtype', [False, True], ids=['float32 bias', 'half bias'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision(cases, dtype, bias_in_q_dtype):
    """Half-precision q, k, v with the float32 head's bias (the published configs' half-precision attention) and with
    a bias in q's dtype (``AttentionBiasGenerator(fp16=True)`` on half features); the kernels read both in float32."""
    q, k, v = cases.make_qkv(dtype=dtype, dim=16)
    bias, leaves = cases.make_bias('segment+window')
    if bias_in_q_dtype:
        bias = bias.to(dtype=dtype)
    assert_matches_math(cases, 'tiled_bias', q, k, v, bias, leaves, *LOW_PRECISION_TOLERANCE[dtype])


def test_bias_only_gradient(cases):
    """Frozen q, k, v (the router-only stage): the amplitudes' and segment values' gradients alone."""
    q, k, v = cases.make_qkv(requires_grad=False)
    bias, leaves = cases.make_bias('segment+window', bias_heads=3)
    grad_out = torch.randn(q.shape)
    grads = torch.autograd.grad(apply_attention(q, k, v, bias, backend='tiled_bias'), leaves, grad_out)
    expected = torch.autograd.grad(apply_attention(q, k, v, bias, backend='math'), leaves, grad_out)
    for grad, reference in zip(grads, expected):
        assert cases.relative_error(grad, reference) <= FP32_TOLERANCE


def test_the_bias_of_the_aqr_bias_generator(cases):
    """What the model gives the decoder: ``AttentionBiasGenerator``'s local bias per head with the mute term (a
    window and a segment part), DN queries first (no window), some queries visible in no camera; the gradients
    reach the generator's ``alpha``, head scales and mute scale as through ``math``."""
    from projects.mmdet3d_plugin.models.aqr import AttentionBiasGenerator
    bs, heads, num_queries, num_dn, bev, camera = 2, 4, 10, 3, (5, 7), (2, 4, 6)
    generator = AttentionBiasGenerator(window_size=5, per_head=True, num_heads=heads, mute_scale=0.5)
    gen = torch.Generator().manual_seed(3)
    pts_bev = torch.stack([torch.randint(0, n, (bs, num_queries), generator=gen) for n in bev], -1)
    visible = torch.rand(bs, num_queries, generator=gen) > 0.3
    pers = torch.stack([torch.randint(0, n, (bs, num_queries), generator=gen) for n in camera], -1)
    info = dict(pts_bev=pts_bev, pts_idx=pts_bev[..., 0] * bev[1] + pts_bev[..., 1], visible=visible,
                pts_pers_idx=torch.where(visible[..., None], pers, torch.full_like(pers, -1)))
    lidar, camera_weights = torch.rand(bs, num_queries, generator=gen), torch.rand(bs, num_queries, generator=gen)
    bias = generator(lidar, camera_weights, info, bev, camera, num_dn_queries=num_dn)
    assert {type(part).__name__ for part in bias.parts} == {'WindowBias', 'SegmentBias'}
    q, k, v = cases.make_qkv(bs=bs, heads=heads, num_queries=num_dn + num_queries, num_keys=bias.num_keys)
    leaves = [q, k, v] + [p for p in generator.parameters() if p.requires_grad]
    grad_out = torch.randn(q.shape, generator=gen)
    results = {}
    for backend in ('tiled_bias', 'math'):
        out = apply_attention(q, k, v, generator(lidar, camera_weights, info, bev, camera, num_dn_queries=num_dn),
                              backend=backend)
        results[backend] = [out] + list(torch.autograd.grad(out, leaves, grad_out))
    assert len(leaves) > 3
    for i, (tiled, reference) in enumerate(zip(results['tiled_bias'], results['math'])):
        assert cases.relative_error(tiled, reference) <= FP32_TOLERANCE, f'output / gradient {i}'


def test_the_custom_operators_fake_implementations_match_the_kernels(cases):
    """``torch.library.opcheck``: the schemas hold and the fake implementations (what ``FakeTensorMode`` and
    ``torch.compile`` see) give the outputs' shapes, dtypes and strides the kernels give, forward and backward."""
    from projects.mmdet3d_plugin.attention.backends.tiled_bias import ops
    from projects.mmdet3d_plugin.attention.backends.tiled_bias.backend import TiledBiasBackend, _bias_tensors
    from projects.mmdet3d_plugin.attention.dispatch import _make_call
    q, k, v = cases.make_qkv(dtype=torch.float16, dim=16, requires_grad=False)
    padding = torch.rand(2, cases.NUM_KEYS) < 0.2
    call = _make_call(q, k, v, cases.make_bias('segment+window', bias_heads=3)[0], padding, 0.0, None)
    tables, amplitude, values = TiledBiasBackend._tables(call)
    bias = tuple(t.detach() if t is not None else None for t in _bias_tensors(tables, amplitude, values, 3))
    out, lse = ops.tiled_bias_forward(q, k, v, *bias, call.scale)
    checks = ('test_schema', 'test_faketensor')
    torch.library.opcheck(ops.tiled_bias_forward, (q, k, v, *bias, call.scale), test_utils=checks)
    torch.library.opcheck(ops.tiled_bias_backward, (torch.randn_like(out).half(), q, k, v, out, lse, *bias, call.scale),
                          test_utils=checks)


def test_a_detector_training_step_through_it_equals_autos(monkeypatch):
    """The demo CMT-AQR (one decoder layer, 20 queries and the DN queries, batch 1) trained one step with the AQR
    bias through ``tiled_bias`` (``STRUCTURED_BIAS_FIRST``) and through ``auto``'s dense choice: the same loss and
    every parameter's gradient (the router's and the bias generator's, whose gradients come through the kernels'
    bias gradients, included), from the same weights, batch and dropout draws."""
    from projects.mmdet3d_plugin.diagnostics.model_benchmark import (ModelBenchmarkOptions, build_detector, load_config,
                                                              make_batch)
    from projects.mmdet3d_plugin.attention import dispatch
    from projects.mmdet3d_plugin.attention.backends import BACKENDS
    options = ModelBenchmarkOptions(tiny=True, queries=20, boxes=3, cfg_options={
        'model.pts_bbox_head.transformer.decoder.num_layers': 1}).resolved()
    cfg = load_config('configs/demo/cmt_aqr_synthetic_tiny.py', options)
    model = build_detector(cfg, seed=0).train()
    batch = make_batch(cfg, options)
    tiled_calls = []
    backend = BACKENDS['tiled_bias']
    run = backend.forward
    monkeypatch.setattr(backend, 'forward', lambda call: tiled_calls.append(call) or run(call))
    results = {}
    for name, first in (('auto', {}), ('tiled_bias', {'cpu': 'tiled_bias'})):
        monkeypatch.setattr(dispatch, 'STRUCTURED_BIAS_FIRST', first)
        torch.manual_seed(5)
        model.zero_grad(set_to_none=True)
        loss = model.train_step(batch, None)['loss']
        loss.backward()
        results[name] = loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(tiled_calls) == 1, 'the decoder layer\'s cross-attention did not run through tiled_bias'
    (loss, grads), (reference_loss, reference) = results['tiled_bias'], results['auto']
    assert torch.allclose(loss, reference_loss, rtol=1e-6)
    assert grads.keys() == reference.keys() and any('aqr_weight_generator' in name for name in grads)
    scale = max(g.abs().max() for g in reference.values())
    for name, gradient in grads.items():
        torch.testing.assert_close(gradient, reference[name], rtol=1e-4, atol=1e-6 * scale, msg=name)
