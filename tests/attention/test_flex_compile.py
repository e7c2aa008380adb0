"""The compiled flex path compiles once per query bucket, not per query count (DN training), on the CPU.

The CUDA ``flex`` path is :func:`run_compiled`; torch compiles flex_attention for CPU inference too, so the
same function is counted here.
"""
import torch
from torch._dynamo.utils import counters

from projects.mmdet3d_plugin.attention import apply_attention
from projects.mmdet3d_plugin.attention.backends.flex import query_bucket, run_compiled
from projects.mmdet3d_plugin.attention.dispatch import _make_call

QUERY_COUNTS = range(20, 32)


def test_compiled_flex_does_not_recompile_per_query_count(cases):
    """12 query counts through the compiled flex_attention: one graph per bucket, results equal to math."""
    torch._dynamo.reset()
    counters.clear()
    with torch.no_grad():
        for num_queries in QUERY_COUNTS:
            bias, _ = cases.make_bias('segment+window', bs=2, heads=2, num_queries=num_queries,
                                      requires_grad=False)
            q, k, v = cases.make_qkv(bs=2, heads=2, num_queries=num_queries, dim=16, requires_grad=False)
            call = _make_call(q, k, v, bias, None, 0.0, None)
            out = run_compiled(call)
            reference = apply_attention(q, k, v, bias, backend='math')
            assert cases.relative_error(out, reference) <= 1e-5, num_queries
    buckets = {query_bucket(n) for n in QUERY_COUNTS}
    assert counters['stats']['unique_graphs'] == len(buckets) == 1, dict(counters['stats'])
    torch._dynamo.reset()
