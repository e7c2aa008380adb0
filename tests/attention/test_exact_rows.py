"""The exact recomputation of ``segment``'s cancelled rows, with the code the CUDA branch runs, on the CPU.

Off the CPU ``segment`` recomputes a budget of rows per sample set by
:class:`ExactRowBudget` from the call's shapes alone
(:func:`backend._recompute_cancelled_rows`); here the same functions run on
CPU tensors.
"""
import math

import pytest
import torch

from projects.mmdet3d_plugin.attention import apply_attention, pop_inexact_rows
from projects.mmdet3d_plugin.attention.backends.segment import backend, exact_rows
from projects.mmdet3d_plugin.attention.backends.segment.exact_rows import (EXACT_ROWS_MAX_ELEMENTS, ExactRowBudget,
                                                                           recompute_rows)
from projects.mmdet3d_plugin.attention.dispatch import _make_call


@pytest.fixture
def problem(cases):
    """A call over 8 queries, its math reference, a stand-in merge output and per-query retained shares."""
    q, k, v = cases.make_qkv(num_queries=8, requires_grad=False)
    bias, _ = cases.make_bias('segment+window', bs=2, heads=3, num_queries=8, requires_grad=False)
    call = _make_call(q, k, v, bias, None, 0.0, None)
    reference = apply_attention(q, k, v, bias, backend='math')
    retained = torch.ones(2, 8)
    retained[0, [1, 5, 6]] = torch.tensor([0.2, 0.01, 0.1])  # three flagged rows in sample 0, worst is query 5
    retained[1, 2] = 0.05
    return call, reference, torch.zeros(2, 3, 8, 8), retained


def test_a_budget_covering_every_flagged_row_recomputes_exactly_those(problem):
    call, reference, out, retained = problem
    exact, overflow = recompute_rows(call, out, retained, 0.25, budget=3)
    flags = retained < 0.25
    torch.testing.assert_close(exact, torch.where(flags[:, None, :, None], reference, out))
    assert overflow.tolist() == [0, 0]


def test_overflow_recomputes_the_worst_rows_and_counts_the_rest_without_failing(problem):
    """More flagged rows than the budget: the two keeping the least mass are recomputed, one is counted."""
    call, reference, out, retained = problem
    exact, overflow = recompute_rows(call, out, retained, 0.25, budget=2)
    assert overflow.tolist() == [1, 0]
    recomputed = torch.zeros(2, 8, dtype=torch.bool)
    recomputed[0, [5, 6]] = True
    recomputed[1, 2] = True
    torch.testing.assert_close(exact, torch.where(recomputed[:, None, :, None], reference, out))


def test_a_zero_budget_leaves_the_output_and_counts_every_flagged_row(problem):
    call, _, out, retained = problem
    exact, overflow = recompute_rows(call, out, retained, 0.25, budget=0)
    assert exact is out and overflow.tolist() == [3, 1]


def test_the_budget_is_a_share_of_the_queries_for_small_calls_and_the_same_on_every_call():
    budget = ExactRowBudget()
    assert budget.share == 1 / 16
    assert [budget.budget(900, 8, 1456) for _ in range(3)] == [57] * 3  # ceil(900 / 16), whatever ran before
    assert budget.budget(7, 8, 1456) == 1 and budget.budget(0, 8, 1456) == 0
    assert ExactRowBudget(share=1.0).budget(900, 8, 1456) == 900
    assert ExactRowBudget(share=0.0).budget(900, 8, 1456) == 0


def test_the_budget_is_capped_by_the_size_of_one_sample_s_score_block():
    """[1, heads, rows, K] float32 scores within EXACT_ROWS_MAX_ELEMENTS: VoV's 56 400 keys allow 37 of 57 rows."""
    budget = ExactRowBudget()
    vov = budget.budget(900, 8, 56400)
    assert vov == EXACT_ROWS_MAX_ELEMENTS // (8 * 56400) == 37 < math.ceil(900 / 16)
    assert vov * 8 * 56400 <= EXACT_ROWS_MAX_ELEMENTS < (vov + 1) * 8 * 56400
    assert budget.budget(900, 8, 10**9) == 1, 'a positive share recomputes at least one row'
    assert ExactRowBudget(max_elements=8 * 100 * 3).budget(900, 8, 100) == 3
    with pytest.raises(ValueError, match='max_elements'):
        ExactRowBudget(max_elements=0)


def test_the_overflow_is_summed_on_the_device_until_popped():
    budget = ExactRowBudget()
    assert budget.pop_inexact() is None
    budget.record(torch.tensor([5, 2]))
    budget.record(torch.tensor([0, 1]))
    assert budget.pop_inexact().item() == 8 and budget.pop_inexact() is None


def test_the_accelerator_branch_recomputes_within_its_budget_and_reports_the_overflow(problem, monkeypatch):
    """``_recompute_cancelled_rows`` as it runs off the CPU: budget from the device's ExactRowBudget (the same on
    every call), overflow summed for the training log."""
    call, reference, out, retained = problem
    device_budget = ExactRowBudget(share=1 / 8)  # 1 row of 8 per sample
    monkeypatch.setattr(exact_rows, '_BUDGETS', {'cpu': device_budget})
    monkeypatch.setattr(type(call), 'device_type', property(lambda self: 'cuda'))
    recomputed = torch.zeros(2, 8, dtype=torch.bool)
    recomputed[0, 5] = recomputed[1, 2] = True
    for _ in range(2):
        result = backend._recompute_cancelled_rows(call, out, retained, 0.25)
        torch.testing.assert_close(result, torch.where(recomputed[:, None, :, None], reference, out))
        assert pop_inexact_rows().item() == 2 and pop_inexact_rows() is None
    # a cap of two rows' score blocks ([1, 3 heads, 2, 85 keys]) with every row's share: two rows per sample
    monkeypatch.setattr(exact_rows, '_BUDGETS', {'cpu': ExactRowBudget(share=1.0, max_elements=2 * 3 * 85)})
    result = backend._recompute_cancelled_rows(call, out, retained, 0.25)
    recomputed[0, 6] = True
    torch.testing.assert_close(result, torch.where(recomputed[:, None, :, None], reference, out))
    assert pop_inexact_rows().item() == 1
