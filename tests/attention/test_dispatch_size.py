"""``auto`` chooses by size as well as exactness: on the CPU a structured bias goes through dense ``sdpa`` while
``bs * heads * Q * K <= DENSE_BIAS_MAX_ELEMENTS[kind, pass]`` and through ``segment`` above it; results equal
``math`` on both sides, each boundary is inclusive, the reason says which side a call is on, and CUDA keeps its
order at every size."""
import contextlib
import logging

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from projects.mmdet3d_plugin.attention import (AttentionBias, KeyGrid, SegmentBias, WindowBias, apply_attention,
                                               dispatch, select_backend)

FP32_TOLERANCE = 1e-5
#: the problems at the real thresholds: bs * heads * Q = 1 024 score rows, so that K stays moderate (64 to 4 096
#: keys) and fp32 reductions over the keys stay well within the tolerance
BS, HEADS, NUM_QUERIES, DIM = 2, 4, 128, 8
GRID_ROWS = 8
#: the benchmark's bias names and the threshold kind they fall under
KINDS = {'global': 'segment', 'local': 'window'}


def _problem(kind, num_keys, device='cpu', num_queries=NUM_QUERIES, requires_grad=True):
    """q, k, v, an AQR-like global (:class:`SegmentBias`) or local (:class:`WindowBias`) bias over ``num_keys``
    keys, and the bias's differentiable factors. The window grid holds ``GRID_ROWS * (num_keys // GRID_ROWS)``
    keys, the others are on no grid."""
    generator = torch.Generator().manual_seed(num_keys)
    q, k, v = (torch.randn(BS, HEADS, n, DIM, generator=generator).to(device).requires_grad_(requires_grad)
               for n in (num_queries, num_keys, num_keys))
    if kind == 'global':
        values = torch.randn(BS, 1, num_queries, 2, generator=generator).to(device).requires_grad_(requires_grad)
        segments = (num_keys // 2, num_keys - num_keys // 2)
        return (q, k, v), AttentionBias(SegmentBias(values, segments), num_keys), [values]
    grid = KeyGrid(0, 1, GRID_ROWS, num_keys // GRID_ROWS)
    centres = torch.stack([torch.zeros(BS, num_queries, dtype=torch.long),
                           torch.randint(0, grid.height, (BS, num_queries), generator=generator),
                           torch.randint(0, grid.width, (BS, num_queries), generator=generator)], -1).to(device)
    amplitude = torch.randn(BS, 1, num_queries, generator=generator).to(device).requires_grad_(requires_grad)
    valid = torch.ones(BS, num_queries, dtype=torch.bool, device=device)
    return (q, k, v), AttentionBias(WindowBias([grid], [centres], [valid], [amplitude], 5), num_keys), [amplitude]


def _relative_error(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).abs().max() / expected.abs().max())


def _assert_auto_runs(expected, qkv, bias, leaves, with_grad, caplog, monkeypatch):
    """``apply_attention(backend='auto')`` runs ``expected`` (its log line says so) and equals ``math``: the
    output, and with ``with_grad`` the gradients of q, k, v and the bias factors."""
    monkeypatch.setattr(dispatch, '_LOGGED', set())
    with caplog.at_level(logging.INFO, logger='mmdet'), \
            (contextlib.nullcontext() if with_grad else torch.no_grad()):
        out = apply_attention(*qkv, bias)
        ref = apply_attention(*qkv, bias, backend='math')
    assert f"backend '{expected}'" in caplog.text, caplog.text
    assert _relative_error(out, ref) <= FP32_TOLERANCE
    if with_grad:
        inputs = list(qkv) + leaves
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        for grad, ref_grad in zip(torch.autograd.grad(out, inputs, grad_out),
                                  torch.autograd.grad(ref, inputs, grad_out)):
            assert _relative_error(grad, ref_grad) <= FP32_TOLERANCE


@pytest.mark.parametrize('pass_name', ['fwd', 'fwdbwd'])
@pytest.mark.parametrize('bias_name', ['global', 'local'])
def test_auto_runs_dense_sdpa_at_the_threshold_and_segment_just_above(bias_name, pass_name, caplog, monkeypatch):
    """With the real DENSE_BIAS_MAX_ELEMENTS: the largest call that fits runs sdpa, one key more runs segment, and
    both equal the math reference."""
    key = (KINDS[bias_name], pass_name)
    rows = BS * HEADS * NUM_QUERIES
    at_threshold = dispatch.DENSE_BIAS_MAX_ELEMENTS[key] // rows
    with_grad = pass_name == 'fwdbwd'
    for num_keys, expected in ((at_threshold, 'sdpa'), (at_threshold + 1, 'segment')):
        qkv, bias, leaves = _problem(bias_name, num_keys, requires_grad=with_grad)
        elements = rows * num_keys
        assert (elements <= dispatch.DENSE_BIAS_MAX_ELEMENTS[key]) == (expected == 'sdpa')
        name, reason = select_backend(qkv[0], bias, k=qkv[1], v=qkv[2])
        assert name == expected, reason
        assert f'bs*heads*Q*K = {elements} {"<=" if expected == "sdpa" else ">"} DENSE_BIAS_MAX_ELEMENTS' \
            f"['{key[0]}', '{key[1]}'] = {dispatch.DENSE_BIAS_MAX_ELEMENTS[key]} on cpu" in reason, reason
        _assert_auto_runs(expected, qkv, bias, leaves, with_grad, caplog, monkeypatch)


@pytest.mark.parametrize('kind, key', [('segment', 'segment'), ('window', 'window'), ('segment+window', 'window')])
@pytest.mark.parametrize('with_grad', [False, True])
def test_each_threshold_is_inclusive_and_applies_to_its_kind_and_pass(cases, kind, key, with_grad, monkeypatch):
    q, k, v = cases.make_qkv(requires_grad=with_grad)
    bias, _ = cases.make_bias(kind, requires_grad=with_grad)
    elements = 2 * 3 * 6 * cases.NUM_KEYS
    key = (key, 'fwdbwd' if with_grad else 'fwd')
    others = dict.fromkeys(dispatch.DENSE_BIAS_MAX_ELEMENTS, 0)  # the other keys would send the call to segment
    monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', {**others, key: elements})
    assert select_backend(q, bias, k=k, v=v)[0] == 'sdpa'
    assert select_backend(q, bias)[0] == 'sdpa', 'without k the bias gives K'
    monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', {**dict.fromkeys(others, 10**12), key: elements - 1})
    assert select_backend(q, bias, k=k, v=v)[0] == 'segment'
    assert select_backend(q, bias)[0] == 'segment'


def test_no_grad_mode_is_the_fwd_pass(cases, monkeypatch):
    q, k, v = cases.make_qkv()
    bias, _ = cases.make_bias('window')
    monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', {('segment', 'fwd'): 0, ('segment', 'fwdbwd'): 0,
                                                             ('window', 'fwd'): 10**12, ('window', 'fwdbwd'): 0})
    assert select_backend(q, bias, k=k, v=v)[0] == 'segment'
    with torch.no_grad():
        assert select_backend(q, bias, k=k, v=v)[0] == 'sdpa'


@pytest.mark.parametrize('kind', ['segment', 'window', 'segment+window'])
@pytest.mark.parametrize('threshold, expected', [(10**12, 'sdpa'), (0, 'segment')])
def test_auto_matches_math_on_both_sides_with_key_padding(cases, kind, threshold, expected, caplog, monkeypatch):
    monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', dict.fromkeys(dispatch.DENSE_BIAS_MAX_ELEMENTS,
                                                                          threshold))
    q, k, v = cases.make_qkv()
    bias, leaves = cases.make_bias(kind)
    padding = torch.rand(2, cases.NUM_KEYS, generator=torch.Generator().manual_seed(3)) < 0.2
    monkeypatch.setattr(dispatch, '_LOGGED', set())
    with caplog.at_level(logging.INFO, logger='mmdet'):
        out = apply_attention(q, k, v, bias, key_padding_mask=padding)
    assert f"backend '{expected}'" in caplog.text
    ref = apply_attention(q, k, v, bias, key_padding_mask=padding, backend='math')
    assert cases.relative_error(out, ref) <= FP32_TOLERANCE
    grads = torch.autograd.grad(out, [q, k, v] + leaves, torch.ones_like(out))
    ref_grads = torch.autograd.grad(ref, [q, k, v] + leaves, torch.ones_like(ref))
    for grad, ref_grad in zip(grads, ref_grads):
        assert cases.relative_error(grad, ref_grad) <= FP32_TOLERANCE


@pytest.mark.parametrize('kind, dropout_p, prefer, expected', [
    ('segment', 0.1, None, 'sdpa'),
    ('window', 0.1, None, 'sdpa'),
    ('lowrank', 0.0, None, 'sdpa'),
    ('segment', 0.0, 'flashbias', 'flashbias'),
    ('window', 0.0, 'flashbias', 'sdpa'),
    ('segment', 0.0, 'segment', 'segment'),
    ('dense', 0.0, None, 'sdpa'),
])
def test_small_calls_keep_prefer_dropout_and_exactness(cases, kind, dropout_p, prefer, expected):
    """The tiny conftest problems are below every threshold: every structured bias takes sdpa (exact, with
    dropout); ``prefer`` still goes first."""
    q, k, v = cases.make_qkv()
    bias, _ = cases.make_bias(kind)
    assert 2 * 3 * 6 * cases.NUM_KEYS <= min(dispatch.DENSE_BIAS_MAX_ELEMENTS.values())
    name, reason = dispatch._choose(dispatch._make_call(q, k, v, bias, None, dropout_p, None), prefer)
    assert name == expected, reason
    if prefer is not None:
        assert f'{prefer} preferred' in reason
    if kind != 'dense':
        assert '<= DENSE_BIAS_MAX_ELEMENTS' in reason


def test_calls_without_a_structured_bias_have_no_size_rule(cases, monkeypatch):
    q, k, v = cases.make_qkv()
    mask = torch.zeros(6, cases.NUM_KEYS, dtype=torch.bool)
    for threshold in (0, 10**12):
        monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', dict.fromkeys(dispatch.DENSE_BIAS_MAX_ELEMENTS,
                                                                              threshold))
        for bias in (None, mask):
            name, reason = select_backend(q, bias, k=k, v=v)
            assert name == 'sdpa' and 'no structured bias' in reason


def test_dense_elements_counts_the_score_matrix(cases):
    q, k, v = cases.make_qkv()
    bias, _ = cases.make_bias('segment')
    assert dispatch.dense_elements(dispatch._make_call(q, k, v, bias, None, 0.0, None)) == 2 * 3 * 6 * 85
    assert dispatch.dense_elements(dispatch._make_call(q, None, None, bias, None, 0.0, None)) == 2 * 3 * 6 * 85


def test_the_log_says_once_per_kind_of_call_whatever_its_size(cases, caplog, monkeypatch):
    """The reason names the size; the log line is still written once per kind of call (DN queries change Q every
    step), and again where a call crosses to the other side of the threshold."""
    monkeypatch.setattr(dispatch, '_LOGGED', set())
    k, v = cases.make_qkv(num_queries=1, requires_grad=False)[1:]
    with caplog.at_level(logging.INFO, logger='mmdet'):
        for num_queries in (5, 6, 7):
            q = torch.randn(2, 3, num_queries, 8)
            apply_attention(q, k, v, cases.make_bias('window', num_queries=num_queries, requires_grad=False)[0])
        monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', dict.fromkeys(dispatch.DENSE_BIAS_MAX_ELEMENTS, 0))
        apply_attention(q, k, v, cases.make_bias('window', num_queries=7, requires_grad=False)[0])
    lines = [r.getMessage() for r in caplog.records if r.name == 'mmdet']
    assert len(lines) == 2, lines
    assert "backend 'sdpa'" in lines[0] and 'bs*heads*Q*K = 2550 <=' in lines[0]
    assert "backend 'segment'" in lines[1] and 'bs*heads*Q*K = 3570 >' in lines[1]


def test_cuda_size_rule_covers_the_window_bias_only(monkeypatch):
    """On (fake) CUDA, beneath ``tiled_bias`` (the calls it cannot run), a small local bias runs dense sdpa
    (CUDA_DENSE_BIAS_MAX_ELEMENTS, measured on an H200), a larger one segment; the global bias takes segment at
    every size."""
    assert dispatch.SIZE_RULE_DEVICES == ('cpu', 'cuda')
    monkeypatch.setattr(dispatch, 'STRUCTURED_BIAS_FIRST', {})
    with FakeTensorMode(allow_non_fake_inputs=True):
        qkv, bias, _ = _problem('global', 64, device='cuda', num_queries=4)
        name, reason = select_backend(qkv[0], bias, k=qkv[1], v=qkv[2])
        assert name == 'segment' and "no size rule on cuda for ['segment', 'fwdbwd']" in reason
        qkv, bias, _ = _problem('local', 64, device='cuda', num_queries=4)
        name, reason = select_backend(qkv[0], bias, k=qkv[1], v=qkv[2])
        assert name == 'sdpa' and "<= CUDA_DENSE_BIAS_MAX_ELEMENTS['window', 'fwdbwd']" in reason, reason
        monkeypatch.setitem(dispatch.CUDA_DENSE_BIAS_MAX_ELEMENTS, ('window', 'fwdbwd'), 0)
        name, reason = select_backend(qkv[0], bias, k=qkv[1], v=qkv[2])
        assert name == 'segment' and "> CUDA_DENSE_BIAS_MAX_ELEMENTS['window', 'fwdbwd'] = 0 on cuda" in reason
