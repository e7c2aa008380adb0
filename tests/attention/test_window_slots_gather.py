"""The ``'gather'`` formulation of the window slot products (the accelerator's, issue 37) equals the CPU one.

``SlotPattern`` computes its three products through ``sampled_addmm`` /
``embedding_bag`` on the CPU (``'sparse'``) and through gathered slot rows and
one ``scatter_add_`` per chunk of queries elsewhere (``'gather'``). Here the
``'gather'`` formulation runs on the CPU: each product against the ``'sparse'``
one on random patterns (invalid slots, duplicate keys, clipped windows, chunks
of queries, strided tables, half-precision tables), the whole ``segment``
backend with it forced against ``math`` (outputs and every gradient), the
routing of the slots that add nothing, and the trace on fake CUDA (no
``embedding_bag``, no host synchronisation, no blocking host copy).
"""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from projects.mmdet3d_plugin.attention import apply_attention
from projects.mmdet3d_plugin.attention.backends.segment import backend as segment_module
from projects.mmdet3d_plugin.attention.slots import window_slots
from projects.mmdet3d_plugin.attention.slots.window_slots import SlotPattern, default_formulation
from projects.mmdet3d_plugin.attention.dispatch import _make_call
from projects.mmdet3d_plugin.utils.host_data import HostCopyCounter
from test_backends import FP32_TOLERANCE, assert_matches_math
from test_fake_cuda import _fake_problem, _segment_forward_and_backward

#: the two formulations sum the same float32 products in different orders
PRODUCT_TOLERANCE = 1e-6


def _random_pattern(bs=2, num_queries=7, length=9, num_keys=20, seed=0):
    """A random ``[bs, Q, L]`` slot index with invalid slots (pointing at key 0, as the callers make them) and
    duplicate keys within a query's slots, and its validity."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, num_keys, (bs, num_queries, length), generator=generator)
    valid = torch.rand(bs, num_queries, length, generator=generator) > 0.3
    valid[:, -1] = False  # a query with no valid slot at all (invisible in every camera)
    index[:, 0, :4] = 3  # the same key in several slots of one query
    index[:, 1, 2:5] = 5
    valid[:, 1, 2:5] = True
    return torch.where(valid, index, torch.zeros_like(index)), valid


def _window_pattern(cases, bs=2, num_queries=6):
    """The slots of the test bias's BEV + camera windows (clipped at the grid borders, invisible queries)."""
    bias, _ = cases.make_bias('window', bs=bs, num_queries=num_queries)
    keys = bias.parts[0].window_keys()
    return keys.index, keys.valid, bias.num_keys


def _patterns(cases):
    index, valid = _random_pattern()
    yield 'random', index, valid, 20
    yield 'window', *_window_pattern(cases, num_queries=7)


def _relative(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def _split_heads(t):
    """``[bs, heads, n, d]`` as the strided view of a ``[bs, n, heads, d]`` table (what the attention module has)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def check_products_against_sparse(cases, formulation, table_dtype, before_each=None):
    """dot, weighted_sum and scatter_add_ of ``formulation`` against ``'sparse'`` on the :func:`_patterns`, with
    strided ``table_dtype`` tables and weights expanded over the heads; ``before_each(pattern)`` runs first."""
    heads, dim = 3, 5
    for name, index, valid, num_keys in _patterns(cases):
        bs, num_queries, length = index.shape
        sparse = SlotPattern(index, num_keys, heads, formulation='sparse')
        other = SlotPattern(index, num_keys, heads, valid=valid, formulation=formulation)
        assert other.formulation == formulation
        if before_each is not None:
            before_each(other)
        a = torch.randn(bs, heads, num_queries, dim)
        x = _split_heads(torch.randn(bs, heads, num_keys, dim)).to(table_dtype)
        # what every caller passes: invalid slots zeroed; one bias head expanded over the heads
        weights = torch.randn(bs, 1, num_queries, length).expand(-1, heads, -1, -1) * valid[:, None]
        for product, expected, actual in [
            ('dot', sparse.dot(a, x, 0.3), other.dot(a, x, 0.3)),
            ('weighted_sum', sparse.weighted_sum(weights, x), other.weighted_sum(weights, x)),
        ]:
            assert actual.dtype == torch.float32 and actual.shape == expected.shape, (name, product)
            assert _relative(actual, expected) <= PRODUCT_TOLERANCE, (name, product, table_dtype)
        start = _split_heads(torch.randn(bs, heads, num_keys, dim))
        expected, actual = start.clone(), start.clone()
        sparse.scatter_add_(expected, weights, a, alpha=0.7)
        other.scatter_add_(actual, weights, a, alpha=0.7)
        assert _relative(actual - start, expected - start) <= PRODUCT_TOLERANCE, (name, 'scatter_add_')


@pytest.mark.parametrize('queries_per_chunk', [None, 1, 3])
@pytest.mark.parametrize('table_dtype', [torch.float32, torch.float16])
def test_gather_products_equal_the_sparse_ones(cases, monkeypatch, queries_per_chunk, table_dtype):
    """dot, weighted_sum and scatter_add_: one chunk, one query per chunk, and chunks with a shorter last one."""
    heads, dim = 3, 5

    def check_chunks(pattern):
        bs, num_queries, length = pattern.index.shape
        if queries_per_chunk is not None:
            monkeypatch.setattr(window_slots, 'GATHER_MAX_ELEMENTS', queries_per_chunk * bs * heads * length * dim)
        chunks = pattern._chunks(heads, dim)
        assert len(chunks) == (1 if queries_per_chunk is None else math.ceil(num_queries / queries_per_chunk))
        assert chunks[-1][1] == num_queries

    check_products_against_sparse(cases, 'gather', table_dtype, check_chunks)


def check_invalid_slot_weights_ignored(cases, formulation):
    """With ``valid``, ``formulation`` adds nothing for an invalid slot, whatever its weight (even NaN)."""
    heads, dim = 2, 4
    for name, index, valid, num_keys in _patterns(cases):
        bs, num_queries, length = index.shape
        sparse = SlotPattern(index, num_keys, heads, formulation='sparse')
        other = SlotPattern(index, num_keys, heads, valid=valid, formulation=formulation)
        a, x = torch.randn(bs, heads, num_queries, dim), torch.randn(bs, heads, num_keys, dim)
        weights = torch.randn(bs, heads, num_queries, length)
        garbage = weights.masked_fill(~valid[:, None], float('nan'))
        clean = weights * valid[:, None]
        assert _relative(other.weighted_sum(garbage, x), sparse.weighted_sum(clean, x)) <= PRODUCT_TOLERANCE, name
        expected, actual = torch.zeros(bs, heads, num_keys, dim), torch.zeros(bs, heads, num_keys, dim)
        sparse.scatter_add_(expected, clean, a)
        other.scatter_add_(actual, garbage, a)
        assert _relative(actual, expected) <= PRODUCT_TOLERANCE, name


def test_gather_products_ignore_the_weights_of_invalid_slots(cases):
    check_invalid_slot_weights_ignored(cases, 'gather')


def test_slots_that_add_nothing_are_spread_over_the_keys(cases):
    """No key receives the invalid slots' no-op adds in bulk: a slot with a non-zero weight keeps its key, the
    others go to ``(q * L + j) mod K`` (at most ``ceil(Q * L / K)`` per key and table)."""
    index, valid, num_keys = _window_pattern(cases, num_queries=40)
    bs, num_queries, length = index.shape
    heads = 2
    pattern = SlotPattern(index, num_keys, heads, valid=valid, formulation='gather')
    weights = pattern._live_weights(torch.rand(bs, heads, num_queries, length) + 0.5)
    routed = pattern.routed_index(weights)
    live = weights != 0
    assert bool((~valid).any()), 'the windows have invalid slots'
    assert torch.equal(routed[live], index[:, None].expand_as(routed)[live])
    slot = torch.arange(num_queries * length).view(num_queries, length) % num_keys
    assert torch.equal(routed[~live], slot.expand_as(routed)[~live])
    # no key gets more than ceil(Q * L / K) no-op adds per table; unrouted, the first key of a grid gets all the
    # invalid slots of its windows
    def dead_per_key(keys):
        counts = torch.zeros(bs, heads, num_keys, dtype=torch.long)
        return counts.scatter_add_(-1, keys.expand_as(routed).flatten(2), (~live).flatten(2).long())

    bound = math.ceil(num_queries * length / num_keys)
    assert int(dead_per_key(routed).max()) <= bound
    assert int(dead_per_key(index[:, None]).max()) > 4 * bound


@pytest.fixture
def gather_on_cpu(monkeypatch):
    """The segment backend with the gather formulation on the CPU, in chunks of a few queries, counting calls."""
    monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', 'gather')
    monkeypatch.setattr(window_slots, 'GATHER_MAX_ELEMENTS', 500)
    calls = []
    original = SlotPattern._gathered_scatter_add_

    def counting(self, *args, **kwargs):
        calls.append(len(self._chunks(self.num_heads, args[2].size(-1))))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SlotPattern, '_gathered_scatter_add_', counting)
    assert default_formulation(torch.device('cpu')) == 'gather'
    return calls


@pytest.mark.parametrize('bias_heads', [1, 3])
@pytest.mark.parametrize('kind', ['window', 'segment+window'])
def test_segment_backend_with_the_gather_formulation_matches_math(cases, gather_on_cpu, kind, bias_heads):
    """Outputs and the gradients of q, k, v, the segment values and the window amplitudes."""
    q, k, v = cases.make_qkv()
    bias, leaves = cases.make_bias(kind, bias_heads=bias_heads)
    assert_matches_math(cases, 'segment', q, k, v, bias, leaves, FP32_TOLERANCE)
    assert len(gather_on_cpu) == 2 and all(chunks > 1 for chunks in gather_on_cpu)  # dk and dv, in chunks


@pytest.mark.parametrize('layout', ['strided', 'padded'])
def test_segment_backend_with_the_gather_formulation_on_strided_and_padded_keys(cases, gather_on_cpu, layout):
    q, k, v = cases.make_qkv()
    padding = None
    if layout == 'strided':
        q, k, v = (_split_heads(t.detach()).requires_grad_() for t in (q, k, v))
    else:
        padding = torch.zeros(2, cases.NUM_KEYS, dtype=torch.bool)
        padding[0, 30:40] = True  # inside the BEV and camera windows of sample 0
        padding[1, -5:] = True
    bias, leaves = cases.make_bias('segment+window')
    assert_matches_math(cases, 'segment', q, k, v, bias, leaves, FP32_TOLERANCE, key_padding_mask=padding)
    assert gather_on_cpu


def check_segment_backend_formulations_agree(cases, monkeypatch, formulation):
    """``formulation`` and ``'sparse'`` inside the whole backend agree far below the tolerance against math."""
    q, k, v = cases.make_qkv(scale_scores=2.0)
    bias, leaves = cases.make_bias('segment+window', bias_heads=3)
    inputs = [q, k, v] + leaves
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    results = {}
    for name in ('sparse', formulation):
        monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', name)
        out = apply_attention(q, k, v, bias, backend='segment')
        results[name] = [out] + list(torch.autograd.grad(out, inputs, grad_out))
    for i, (sparse, other) in enumerate(zip(results['sparse'], results[formulation])):
        assert _relative(other, sparse) <= 1e-6, i


def test_segment_backend_gives_the_same_result_with_either_formulation(cases, monkeypatch):
    check_segment_backend_formulations_agree(cases, monkeypatch, 'gather')


class _OpRecorder(TorchDispatchMode):
    """The names of the aten ops dispatched inside the mode."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.name())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('formulation, products', [
    ('gather', {'aten::gather', 'aten::scatter_add_'}),
    ('triton', {'cmt_aqr::slot_dot', 'cmt_aqr::slot_weighted_sum', 'cmt_aqr::slot_scatter_add_'})])
@pytest.mark.parametrize('dtype', [torch.float16, torch.float32])
def test_cuda_formulations_trace_on_fake_cuda_without_embedding_bag(monkeypatch, dtype, formulation, products):
    """At the R50 shape on fake CUDA: the segment forward and backward use the formulation (``'triton'``, CUDA's
    default, through its custom operators' fake implementations), dispatch no ``embedding_bag``, ``nonzero`` or
    sort, and copy no host data to the device."""
    pytest.importorskip('triton', reason='the triton package comes with the CUDA builds of torch that setup installs')
    monkeypatch.setitem(window_slots.FORMULATIONS, 'cuda', formulation)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v, bias = _fake_problem('both', dtype)
        with HostCopyCounter() as copies, _OpRecorder() as recorder:
            out, _, grads, _ = _segment_forward_and_backward(q, k, v, bias)
        assert copies.copies == []
        assert not {op for op in recorder.ops if any(word in op for word in ('embedding_bag', 'nonzero', 'sort',
                                                                             'searchsorted', 'sparse'))}
        assert products <= recorder.ops
        assert [g.shape for g in grads[:3]] == [q.shape, k.shape, v.shape]
        pattern = segment_module.SegmentBackend._plan(_make_call(q, k, v, bias, None, 0.0, None))[0].window
        assert pattern.formulation == formulation and pattern.valid is not None


def check_local_window_attention_formulations_agree(monkeypatch, formulation, attn_drop=0.0):
    """The AQR local window attention (``models/aqr/local_window.py``, a pattern without ``valid``: the slots it
    gives weight 0, invalid or dropped, add nothing) with ``formulation`` and ``'sparse'``."""
    from projects.mmdet3d_plugin.attention.bias.window_cells import window_offsets, window_token_index
    from projects.mmdet3d_plugin.models.aqr.local_window import LocalWindowAttention
    bs, num_queries, dims, grid = 2, 9, 16, (5, 6)
    torch.manual_seed(0)
    module = LocalWindowAttention(dims, num_heads=4, attn_drop=attn_drop).train(attn_drop > 0)
    centres = torch.stack([torch.randint(0, grid[0], (bs, num_queries)), torch.randint(0, grid[1], (bs, num_queries))],
                          -1)
    centres[:, 0] = 0  # clipped windows
    visible = torch.rand(bs, num_queries) > 0.3
    visible[:, -1] = False
    index, valid = window_token_index(centres, grid, window_offsets(3), center_valid=visible)
    query, key, value = (torch.randn(bs, n, dims, requires_grad=True) for n in (num_queries, 30, 30))
    inputs = [query, key, value] + list(module.parameters())
    results = {}
    for name in ('sparse', formulation):
        monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', name)
        torch.manual_seed(1)  # the same dropout draw
        out = module(query, key, value, index, valid)
        results[name] = [out] + list(torch.autograd.grad(out.square().sum(), inputs))
    # k_proj.bias's gradient is 0 up to rounding (a softmax is invariant to a shift of all its scores): absolute
    for i, (sparse, other) in enumerate(zip(results['sparse'], results[formulation])):
        torch.testing.assert_close(other, sparse, rtol=1e-6, atol=1e-6, msg=f'output / gradient {i}')


@pytest.mark.parametrize('attn_drop', [0.0, 0.3])
def test_local_window_attention_gives_the_same_result_with_either_formulation(monkeypatch, attn_drop):
    check_local_window_attention_formulations_agree(monkeypatch, 'gather', attn_drop)
