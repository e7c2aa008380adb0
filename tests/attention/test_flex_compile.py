"""The compiled flex path pads queries to buckets: one compile per bucket, and exact outputs and gradients.

The CUDA ``flex`` path is :func:`run_compiled`; torch compiles flex_attention for CPU inference too, so the
same function is counted here. CPU flex has no backward, so the gradients through the padded call (the padded
query rows, the ``score_mod``'s captured bias tensors) are checked with the compiled kernel replaced by a dense
evaluation of the same ``score_mod``.
"""
import torch
from torch._dynamo.utils import counters

from projects.mmdet3d_plugin.attention import apply_attention
from projects.mmdet3d_plugin.attention.backends import flex
from projects.mmdet3d_plugin.attention.dispatch import _make_call

#: with buckets of 8 queries these counts fall in two buckets (24 and 32 rows)
BUCKET = 8
QUERY_COUNTS = (20, 23, 24, 25, 31)


def test_compiled_flex_compiles_once_per_bucket_across_bucket_boundaries(cases, monkeypatch):
    """Query counts on both sides of a bucket boundary: one graph per bucket, results equal to math."""
    monkeypatch.setattr(flex, 'QUERY_BUCKET', BUCKET)
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        for num_queries in QUERY_COUNTS:
            bias, _ = cases.make_bias('segment+window', bs=2, heads=2, num_queries=num_queries,
                                      requires_grad=False)
            q, k, v = cases.make_qkv(bs=2, heads=2, num_queries=num_queries, dim=16, requires_grad=False)
            out = flex.run_compiled(_make_call(q, k, v, bias, None, 0.0, None))
            reference = apply_attention(q, k, v, bias, backend='math')
            assert cases.relative_error(out, reference) <= 1e-5, num_queries
    buckets = {flex.query_bucket(n) for n in QUERY_COUNTS}
    assert buckets == {24, 32}
    assert counters['stats']['unique_graphs'] == len(buckets), dict(counters['stats'])
    torch._dynamo.reset()


def _dense_flex_attention(q, k, v, score_mod, scale):
    """flex_attention's result evaluated densely (differentiable): ``score_mod`` on broadcast index grids."""
    bs, heads, num_rows, _ = q.shape
    index = [torch.arange(n).view(*shape) for n, shape in ((bs, (-1, 1, 1, 1)), (heads, (1, -1, 1, 1)),
                                                         (num_rows, (1, 1, -1, 1)), (k.size(2), (1, 1, 1, -1)))]
    scores = score_mod(torch.matmul(q, k.transpose(-1, -2)) * scale, *index)
    return torch.matmul(torch.softmax(scores, -1), v)


def test_gradients_through_the_padded_call_equal_math(cases, monkeypatch):
    """q, k, v and every bias tensor get math's gradients through the padding (rows past Q are dropped)."""
    monkeypatch.setattr(flex, 'QUERY_BUCKET', BUCKET)
    monkeypatch.setattr(flex, 'compiled_flex_attention', lambda: _dense_flex_attention)
    for num_queries in (20, 25):
        bias, leaves = cases.make_bias('segment+window', bs=2, heads=2, num_queries=num_queries, bias_heads=2)
        q, k, v = cases.make_qkv(bs=2, heads=2, num_queries=num_queries, dim=16)
        out = flex.run_compiled(_make_call(q, k, v, bias, None, 0.0, None))
        reference = apply_attention(q, k, v, bias, backend='math')
        assert out.shape == q.shape and cases.relative_error(out, reference) <= 1e-5
        grad_out = torch.randn_like(out)
        grads = torch.autograd.grad(out, [q, k, v] + leaves, grad_out)
        expected = torch.autograd.grad(reference, [q, k, v] + leaves, grad_out)
        for grad, ref in zip(grads, expected):
            assert cases.relative_error(grad, ref) <= 1e-5, num_queries
