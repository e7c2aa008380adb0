"""Checks of the ``'triton'`` slot products under Triton's interpreter, run by ``test_window_slots_triton.py``.

Not collected by the suite (the name has no ``test_`` prefix): the
interpreter must be on (``TRITON_INTERPRET=1``) before Triton is first
imported, and the package imports Triton's language module (through torch's
FlexAttention), so ``test_window_slots_triton.py`` runs this module in a
pytest process of its own with the variable set. The kernels of
``attention/slots/slot_kernels.py`` run on CPU tensors: each
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

from projects.mmdet3d_plugin.attention.slots import window_slots
from test_backends import FP32_TOLERANCE, assert_matches_math
from test_window_slots_gather import (check_invalid_slot_weights_ignored, check_local_window_attention_formulations_agree,
                                      check_products_against_sparse, check_segment_backend_formulations_agree)

if os.environ.get('TRITON_INTERPRET') != '1':
    raise RuntimeError('run with TRITON_INTERPRET=1 (test_window_slots_triton.py does)')


@pytest.mark.parametrize('table_dtype, slots_per_program', [(torch.float32, None), (torch.float16, 4)])
def test_triton_products_equal_the_sparse_ones(cases, monkeypatch, table_dtype, slots_per_program):
    """One slot group per program (the patterns have 9 and 50 slots), and groups of 4 with a shorter last one."""
    if slots_per_program is not None:
        from projects.mmdet3d_plugin.attention.slots import slot_kernels
        monkeypatch.setattr(slot_kernels, 'SLOTS_PER_PROGRAM', slots_per_program)
    check_products_against_sparse(cases, 'triton', table_dtype)


def test_triton_products_ignore_the_weights_of_invalid_slots(cases):
    check_invalid_slot_weights_ignored(cases, 'triton')


@pytest.mark.parametrize('kind, bias_heads, padded', [('window', 1, False), ('segment+window', 3, True)])
def test_segment_backend_with_the_triton_formulation_matches_math(cases, monkeypatch, slot_formulations_used, kind,
                                                                  bias_heads, padded):
    """Outputs and the gradients of q, k, v, the segment values and the window amplitudes."""
    monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', 'triton')
    q, k, v = cases.make_qkv()
    padding = None
    if padded:
        padding = torch.zeros(2, cases.NUM_KEYS, dtype=torch.bool)
        padding[0, 30:40] = True  # inside the BEV and camera windows of sample 0
        padding[1, -5:] = True
    bias, leaves = cases.make_bias(kind, bias_heads=bias_heads)
    assert_matches_math(cases, 'segment', q, k, v, bias, leaves, FP32_TOLERANCE, key_padding_mask=padding)
    assert slot_formulations_used and set(slot_formulations_used) == {'triton'}


def test_local_window_attention_gives_the_same_result_with_the_triton_formulation(monkeypatch):
    check_local_window_attention_formulations_agree(monkeypatch, 'triton')


def test_segment_backend_gives_the_same_result_with_the_triton_formulation(cases, monkeypatch):
    check_segment_backend_formulations_agree(cases, monkeypatch, 'triton')


def test_the_custom_operators_fake_implementations_match_the_kernels():
    """``torch.library.opcheck``: the schemas hold (``slot_scatter_add_`` writes its target and nothing else) and the
    fake implementations (what ``FakeTensorMode`` and ``torch.compile`` see) give the outputs' shapes, dtypes and
    strides the kernels give: CUDA's default formulation traces on fake tensors (``tools/count_device_ops.py``)."""
    from projects.mmdet3d_plugin.attention.slots import slot_ops
    bs, heads, num_queries, length, num_keys, dim = 2, 3, 5, 4, 11, 8
    index = torch.randint(0, num_keys, (bs, num_queries, length))
    valid = (torch.rand(bs, num_queries, length) > 0.3).to(torch.uint8)
    a, x = torch.randn(bs, heads, num_queries, dim), torch.randn(bs, heads, num_keys, dim).half()
    weights = torch.randn(bs, 1, num_queries, length).expand(-1, heads, -1, -1)
    checks = ('test_schema', 'test_faketensor')
    torch.library.opcheck(slot_ops.slot_dot, (index, a, x, 0.5), test_utils=checks)
    for mask in (valid, None):
        torch.library.opcheck(slot_ops.slot_weighted_sum, (index, mask, weights, x), test_utils=checks)
        target = torch.zeros(bs, heads, num_keys, dim)
        torch.library.opcheck(slot_ops.slot_scatter_add_, (index, mask, target, weights, a, 2.0), test_utils=checks)
