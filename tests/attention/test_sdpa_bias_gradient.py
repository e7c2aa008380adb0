"""``sdpa`` when only the bias needs a gradient: the kernel gets a query that requires grad.

On CUDA, PyTorch's memory-efficient SDPA keeps the logsumexp its backward
needs only when q, k or v require grad; a bias-only gradient (the ``alpha``
check of ``tools/check_gpu.py``, router-only training) then failed on an H200
with ``LSE is not correctly aligned (strideH)``. These tests pin the rule that
avoids it, on the CPU and traced on fake CUDA, and that the bias gradient it
gives equals the reference.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from projects.mmdet3d_plugin.attention import AttentionBias, SegmentBias, apply_attention
from projects.mmdet3d_plugin.attention.backends import sdpa

KIND_PARAMS = ('window', 'segment+window', 'dense')


def _spy_on_kernel(monkeypatch):
    """Record the query of every SDPA call of the backend."""
    seen = []
    kernel = F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        seen.append(q)
        return kernel(q, *args, **kwargs)

    monkeypatch.setattr(sdpa.F, 'scaled_dot_product_attention', spy)
    return seen


@pytest.mark.parametrize('kind', KIND_PARAMS)
def test_bias_only_gradient_gives_the_kernel_a_query_that_requires_grad(cases, kind, monkeypatch):
    seen = _spy_on_kernel(monkeypatch)
    q, k, v = cases.make_qkv(requires_grad=False)
    bias, leaves = cases.make_bias(kind)
    out = apply_attention(q, k, v, bias, backend='sdpa')
    grads = torch.autograd.grad(out.square().sum(), leaves)
    expected_out = apply_attention(q, k, v, bias, backend='math')
    expected = torch.autograd.grad(expected_out.square().sum(), leaves)
    assert len(seen) == 1 and seen[0] is not q and seen[0].requires_grad
    assert not q.requires_grad, "the caller's query is left as it was"
    assert cases.relative_error(out, expected_out) < 1e-5
    for grad, reference in zip(grads, expected):
        assert cases.relative_error(grad, reference) < 1e-5


def test_query_is_passed_through_when_qkv_or_nothing_need_a_gradient(cases, monkeypatch):
    seen = _spy_on_kernel(monkeypatch)
    bias, _ = cases.make_bias('window')
    q, k, v = cases.make_qkv(requires_grad=True)
    apply_attention(q, k, v, bias, backend='sdpa')
    with torch.no_grad():
        apply_attention(q, k, v, bias, backend='sdpa')
    frozen_bias, _ = cases.make_bias('window', requires_grad=False)
    frozen_q, k, v = cases.make_qkv(requires_grad=False)
    apply_attention(frozen_q, k, v, frozen_bias, backend='sdpa')
    assert [query is expected for query, expected in zip(seen, (q, q, frozen_q))] == [True] * 3


def test_bias_only_gradient_on_fake_cuda_reaches_the_kernel_with_a_query_that_requires_grad(monkeypatch):
    """The CUDA call of the failing H200 case (R50 keys, 900 queries, batch 2), traced without a GPU."""
    seen = _spy_on_kernel(monkeypatch)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v = (torch.randn(2, 8, n, 32, device='cuda') for n in (900, 22384, 22384))
        values = torch.randn(2, 1, 900, 2, device='cuda', requires_grad=True)
        bias = AttentionBias([SegmentBias(values, [16384, 6000])], 22384)
        out = apply_attention(q, k, v, bias, backend='sdpa')
    assert len(seen) == 1 and seen[0] is not q and seen[0].requires_grad
    assert out.device.type == 'cuda' and out.requires_grad
