"""Checks of the ``'triton'`` slot products under Triton's interpreter, run by ``test_window_slots_triton.py``.

Not collected by the suite (the name has no ``test_`` prefix): the
interpreter must be on (``TRITON_INTERPRET=1``) before Triton is first
imported, and the package imports Triton's language module (through torch's
FlexAttention), so ``test_window_slots_triton.py`` runs this module in a
pytest process of its own with the variable set. The kernels of
``attention/backends/segment/slot_kernels.py`` run on CPU tensors: each
product against the ``'sparse'`` one (random patterns with invalid slots and
duplicate keys, the test bias's clipped windows, strided and half-precision
tables, weights expanded over the heads), invalid slots adding nothing
whatever their weight, the whole ``segment`` backend with the formulation
forced against ``math`` (outputs and every gradient, key padding too), and
the AQR local window attention.
"""
import os

import pytest
import torch

from projects.mmdet3d_plugin.attention import apply_attention
from projects.mmdet3d_plugin.attention.backends.segment import window_slots
from projects.mmdet3d_plugin.attention.backends.segment.window_slots import SlotPattern
from test_backends import FP32_TOLERANCE, assert_matches_math
from test_window_slots_gather import PRODUCT_TOLERANCE, _patterns, _relative, _split_heads

if os.environ.get('TRITON_INTERPRET') != '1':
    raise RuntimeError('run with TRITON_INTERPRET=1 (test_window_slots_triton.py does)')


@pytest.mark.parametrize('table_dtype', [torch.float32, torch.float16])
def test_triton_products_equal_the_sparse_ones(cases, table_dtype):
    heads, dim = 3, 5
    for name, index, valid, num_keys in _patterns(cases):
        bs, num_queries, length = index.shape
        sparse = SlotPattern(index, num_keys, heads)
        fused = SlotPattern(index, num_keys, heads, valid=valid, formulation='triton')
        a = torch.randn(bs, heads, num_queries, dim).to(table_dtype)
        x = _split_heads(torch.randn(bs, heads, num_keys, dim)).to(table_dtype)
        weights = torch.randn(bs, 1, num_queries, length).expand(-1, heads, -1, -1) * valid[:, None]
        for product, expected, actual in [
            ('dot', sparse.dot(a, x, 0.3), fused.dot(a, x, 0.3)),
            ('weighted_sum', sparse.weighted_sum(weights, x), fused.weighted_sum(weights, x)),
        ]:
            assert actual.dtype == torch.float32 and actual.shape == expected.shape, (name, product)
            assert _relative(actual, expected) <= PRODUCT_TOLERANCE, (name, product, table_dtype)
        start = _split_heads(torch.randn(bs, heads, num_keys, dim))
        expected, actual = start.clone(), start.clone()
        sparse.scatter_add_(expected, weights, a, alpha=0.7)
        fused.scatter_add_(actual, weights, a, alpha=0.7)
        assert _relative(actual - start, expected - start) <= PRODUCT_TOLERANCE, (name, 'scatter_add_')


def test_triton_products_ignore_the_weights_of_invalid_slots(cases):
    heads, dim = 2, 4
    for name, index, valid, num_keys in _patterns(cases):
        bs, num_queries, length = index.shape
        sparse = SlotPattern(index, num_keys, heads)
        fused = SlotPattern(index, num_keys, heads, valid=valid, formulation='triton')
        a, x = torch.randn(bs, heads, num_queries, dim), torch.randn(bs, heads, num_keys, dim)
        weights = torch.randn(bs, heads, num_queries, length)
        garbage = weights.masked_fill(~valid[:, None], float('nan'))
        clean = weights * valid[:, None]
        assert _relative(fused.weighted_sum(garbage, x), sparse.weighted_sum(clean, x)) <= PRODUCT_TOLERANCE, name
        expected, actual = torch.zeros(bs, heads, num_keys, dim), torch.zeros(bs, heads, num_keys, dim)
        sparse.scatter_add_(expected, clean, a)
        fused.scatter_add_(actual, garbage, a)
        assert _relative(actual, expected) <= PRODUCT_TOLERANCE, name


@pytest.mark.parametrize('kind, bias_heads, padded', [('window', 1, False), ('segment+window', 3, True)])
def test_segment_backend_with_the_triton_formulation_matches_math(cases, monkeypatch, kind, bias_heads, padded):
    """Outputs and the gradients of q, k, v, the segment values and the window amplitudes."""
    monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', 'triton')
    used = []
    original = SlotPattern.scatter_add_

    def recording(self, *args, **kwargs):
        used.append(self.formulation)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SlotPattern, 'scatter_add_', recording)
    q, k, v = cases.make_qkv()
    padding = None
    if padded:
        padding = torch.zeros(2, cases.NUM_KEYS, dtype=torch.bool)
        padding[0, 30:40] = True  # inside the BEV and camera windows of sample 0
        padding[1, -5:] = True
    bias, leaves = cases.make_bias(kind, bias_heads=bias_heads)
    assert_matches_math(cases, 'segment', q, k, v, bias, leaves, FP32_TOLERANCE, key_padding_mask=padding)
    assert used == ['triton', 'triton']  # dk and dv


def test_local_window_attention_gives_the_same_result_with_the_triton_formulation(monkeypatch):
    """The AQR local window attention (a pattern without ``valid``: the dead slots have weight 0)."""
    from projects.mmdet3d_plugin.models.aqr.local_window import LocalWindowAttention, window_token_index
    bs, num_queries, dims, grid = 2, 9, 16, (5, 6)
    torch.manual_seed(0)
    module = LocalWindowAttention(dims, num_heads=4).eval()
    centres = torch.stack([torch.randint(0, grid[0], (bs, num_queries)), torch.randint(0, grid[1], (bs, num_queries))],
                          -1)
    centres[:, 0] = 0  # clipped windows
    visible = torch.rand(bs, num_queries) > 0.3
    visible[:, -1] = False
    index, valid = window_token_index(centres, grid, 3, center_valid=visible)
    query, key, value = (torch.randn(bs, n, dims, requires_grad=True) for n in (num_queries, 30, 30))
    inputs = [query, key, value] + list(module.parameters())
    results = {}
    for formulation in ('sparse', 'triton'):
        monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', formulation)
        out = module(query, key, value, index, valid)
        results[formulation] = [out] + list(torch.autograd.grad(out.square().sum(), inputs))
    for i, (sparse, fused) in enumerate(zip(results['sparse'], results['triton'])):
        torch.testing.assert_close(fused, sparse, rtol=1e-6, atol=1e-6, msg=f'output / gradient {i}')


def test_apply_attention_with_the_triton_formulation_agrees_with_the_sparse_one(cases, monkeypatch):
    """Far below the tolerance against math: the same sums in another order."""
    q, k, v = cases.make_qkv(scale_scores=2.0)
    bias, leaves = cases.make_bias('segment+window', bias_heads=3)
    inputs = [q, k, v] + leaves
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    results = {}
    for formulation in ('sparse', 'triton'):
        monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', formulation)
        out = apply_attention(q, k, v, bias, backend='segment')
        results[formulation] = [out] + list(torch.autograd.grad(out, inputs, grad_out))
    for i, (sparse, fused) in enumerate(zip(results['sparse'], results['triton'])):
        assert _relative(fused, sparse) <= 1e-6, i
