"""apply_attention's validation, backend choice, logging and refusals."""
import logging
import os

import pytest
import torch

from projects.mmdet3d_plugin.attention import (BACKENDS, AttentionBias, KeyGrid, SegmentBias,
                                               UnsupportedAttentionError, WindowBias, apply_attention, select_backend)
from projects.mmdet3d_plugin.attention import dispatch


@pytest.fixture
def above_the_size_threshold(monkeypatch):
    """Every call counts as large: ``auto``'s order without the CPU size rule (test_dispatch_size.py tests it)."""
    monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', dict.fromkeys(dispatch.DENSE_BIAS_MAX_ELEMENTS, 0))


@pytest.mark.parametrize('kind, dropout_p, expected', [
    ('segment', 0.0, 'segment'),
    ('window', 0.0, 'segment'),
    ('segment+window', 0.0, 'segment'),
    ('lowrank', 0.0, 'flashbias'),
    ('segment', 0.1, 'flashbias'),
    ('window', 0.1, 'sdpa'),
    ('segment+window+lowrank', 0.0, 'sdpa'),
    ('dense', 0.0, 'sdpa'),
    ('none', 0.0, 'sdpa'),
])
def test_auto_choice_on_cpu(cases, kind, dropout_p, expected, above_the_size_threshold):
    q, k, v = cases.make_qkv()
    bias = None if kind == 'none' else cases.make_bias(kind)[0]
    name, reason = select_backend(q, bias, dropout_p=dropout_p, k=k, v=v)
    assert name == expected, reason
    assert 'flex' not in reason.split('skipped')[0], 'auto must not consider flex on CPU'


def test_auto_choice_with_key_padding_and_bool_mask(cases, above_the_size_threshold):
    q, k, v = cases.make_qkv()
    padding = torch.zeros(2, cases.NUM_KEYS, dtype=torch.bool)
    assert select_backend(q, cases.make_bias('segment')[0], padding)[0] == 'segment'
    assert select_backend(q, torch.zeros(6, cases.NUM_KEYS, dtype=torch.bool), padding)[0] == 'sdpa'


def test_auto_logs_once_which_backend_and_why(cases, caplog, above_the_size_threshold):
    dispatch._LOGGED.clear()
    q, k, v = cases.make_qkv(requires_grad=False)
    bias, _ = cases.make_bias('segment', requires_grad=False)
    with caplog.at_level(logging.INFO, logger='mmdet'):
        for _ in range(3):
            apply_attention(q, k, v, bias)
    lines = [r.getMessage() for r in caplog.records if r.name == 'mmdet']
    assert len(lines) == 1
    assert "backend 'segment'" in lines[0] and 'SegmentBias' in lines[0] and 'first of' in lines[0]


@pytest.mark.parametrize('backend, kind, dropout_p, message', [
    ('flash_attn', 'segment', 0.0, 'flash_attn applies no bias'),
    ('flash_attn', 'none', 0.0, 'needs a CUDA device'),
    ('segment', 'lowrank', 0.0, 'segment applies only SegmentBias and WindowBias, not LowRankBias'),
    ('segment', 'dense', 0.0, 'not DenseBias'),
    ('segment', 'segment', 0.1, 'segment applies no attention dropout'),
    ('flashbias', 'window', 0.0, 'flashbias applies only low-rank biases'),
    ('flex', 'segment', 0.1, 'flex applies no attention dropout'),
    ('flex', 'segment', 0.0, 'no backward on CPU'),
])
def test_backend_refuses_what_it_cannot_apply(cases, backend, kind, dropout_p, message):
    q, k, v = cases.make_qkv()
    bias = None if kind == 'none' else cases.make_bias(kind)[0]
    with pytest.raises(UnsupportedAttentionError, match=message) as error:
        apply_attention(q, k, v, bias, backend=backend, dropout_p=dropout_p)
    assert error.value.backend == backend and error.value.reasons


def test_flash_attn_is_not_imported_by_the_package():
    import sys
    assert 'flash_attn' not in sys.modules
    assert set(BACKENDS) == {'math', 'sdpa', 'segment', 'flashbias', 'flex', 'flash_attn', 'tiled_bias'}


def test_triton_kernels_are_not_imported_by_the_package():
    """Triton is a CUDA extra: the package imports the kernel modules when their backend or formulation runs.
    In a fresh process (other tests of a worker run the kernels)."""
    import subprocess
    import sys
    kernels = ['projects.mmdet3d_plugin.attention.backends.tiled_bias.kernels',
               'projects.mmdet3d_plugin.attention.slots.slot_kernels']
    code = ('import sys, projects.mmdet3d_plugin; '
            f'print([name for name in {kernels!r} if name in sys.modules])')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == '[]'


@pytest.mark.parametrize('make_args, message', [
    (lambda q, k, v: dict(q=q, k=k[:, :2], v=v[:, :2]), 'must be'),
    (lambda q, k, v: dict(q=q, k=k, v=v[..., :4]), 'head dim'),
    (lambda q, k, v: dict(q=q, k=k.double(), v=v), 'float64'),
    (lambda q, k, v: dict(q=q, k=k, v=v, key_padding_mask=torch.zeros(2, 84, dtype=torch.bool)), 'key_padding_mask'),
    (lambda q, k, v: dict(q=q, k=k, v=v, key_padding_mask=torch.zeros(2, 85)), 'bool'),
    (lambda q, k, v: dict(q=q, k=k, v=v, bias=torch.zeros(7, 85)), 'number of queries'),
    (lambda q, k, v: dict(q=q, k=k, v=v, bias=SegmentBias(torch.zeros(2, 1, 6, 2), (40, 40))), '80 keys'),
    (lambda q, k, v: dict(q=q, k=k, v=v, bias=SegmentBias(torch.zeros(3, 1, 6, 1), (85, ))), 'batch size is 3'),
    (lambda q, k, v: dict(q=q, k=k, v=v, dropout_p=1.0), 'dropout_p'),
    (lambda q, k, v: dict(q=q, k=k, v=v, backend='xformers'), 'unknown attention backend'),
])
def test_bad_arguments_raise_clear_errors(cases, make_args, message):
    q, k, v = cases.make_qkv(requires_grad=False)
    with pytest.raises(ValueError, match=message):
        apply_attention(**make_args(q, k, v))


def test_bare_parts_are_accepted_when_they_know_the_keys(cases):
    q, k, v = cases.make_qkv(requires_grad=False)
    values = torch.randn(2, 1, 6, 2)
    bare = apply_attention(q, k, v, SegmentBias(values, cases.SEGMENTS))
    wrapped = apply_attention(q, k, v, AttentionBias(SegmentBias(values, cases.SEGMENTS), cases.NUM_KEYS))
    torch.testing.assert_close(bare, wrapped)
    window = WindowBias(KeyGrid(0, 1, 5, 7), torch.zeros(2, 6, 3, dtype=torch.long),
                        torch.ones(2, 6, dtype=torch.bool), torch.ones(2, 1, 6), 3)
    torch.testing.assert_close(apply_attention(q, k, v, window, backend='segment'),
                               apply_attention(q, k, v, window, backend='math'))


def test_output_keeps_the_query_dtype(cases):
    q, k, v = cases.make_qkv(dtype=torch.bfloat16, requires_grad=False)
    bias, _ = cases.make_bias('segment+window', requires_grad=False)
    for backend in ('math', 'sdpa', 'segment'):
        assert apply_attention(q, k, v, bias, backend=backend).dtype == torch.bfloat16


@pytest.mark.parametrize('backend', ['math', 'segment'])
def test_autocast_does_not_lower_the_precision_of_fp32_inputs(cases, backend):
    q, k, v = cases.make_qkv(requires_grad=False)
    bias, _ = cases.make_bias('segment+window', requires_grad=False)
    plain = apply_attention(q, k, v, bias, backend=backend)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        autocast = apply_attention(q, k, v, bias, backend=backend)
    assert autocast.dtype == torch.float32
    assert cases.relative_error(autocast, plain) <= 1e-6


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_sdpa_refuses_the_gradient_of_a_segment_bias_in_low_precision(cases, dtype, above_the_size_threshold):
    """Summed from a half-precision dense mask gradient, a segment's gradient cancels to noise (H200: 0.3-0.5)."""
    q, k, v = cases.make_qkv(dtype=dtype)
    bias = cases.make_bias('segment')[0]
    with pytest.raises(UnsupportedAttentionError, match=f'SegmentBias summed from a dense {dtype} mask'):
        apply_attention(q, k, v, bias, backend='sdpa')
    assert select_backend(q, bias, k=k, v=v)[0] == 'segment'
    with torch.no_grad():
        assert apply_attention(q, k, v, bias, backend='sdpa').dtype == dtype
    apply_attention(q, k, v, cases.make_bias('segment', requires_grad=False)[0], backend='sdpa')
    apply_attention(*cases.make_qkv(), bias, backend='sdpa')  # float32
