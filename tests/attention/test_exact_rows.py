"""The exact recomputation of ``segment``'s cancelled rows, with the code the CUDA branch runs, on the CPU.

Off the CPU ``segment`` recomputes a budget of rows per sample set by
:class:`ExactRowBudget` (:func:`segment._recompute_cancelled_rows`); here the
same functions run on CPU tensors (a CPU need is read back at once instead of
through pinned memory and an event).
"""
import pytest
import torch

from projects.mmdet3d_plugin.attention import apply_attention
from projects.mmdet3d_plugin.attention.backends import exact_rows, segment
from projects.mmdet3d_plugin.attention.backends.exact_rows import ExactRowBudget, recompute_rows
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


def test_budget_follows_the_observed_need():
    budget = ExactRowBudget(initial_share=1 / 16, headroom=2.0, history=3)
    assert budget.budget(900) == 57  # nothing observed yet
    budget.record(torch.tensor([0, 0]), torch.tensor([0, 0]))
    assert budget.budget(900) == 0  # no row needed it: the recomputation costs nothing
    budget.record(torch.tensor([5, 2]), torch.tensor([5, 2]))
    assert budget.budget(900) == 10 and budget.budget(7) == 7
    for _ in range(3):
        budget.record(torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert budget.budget(900) == 2  # the need of 5 left the history
    assert budget.pop_inexact().item() == 7 and budget.pop_inexact() is None


def test_the_accelerator_branch_recomputes_within_its_budget_and_reports_the_overflow(problem, monkeypatch):
    """``_recompute_cancelled_rows`` as it runs off the CPU: budget from the device's ExactRowBudget, overflow
    summed for the training log."""
    call, reference, out, retained = problem
    device_budget = ExactRowBudget(initial_share=1 / 8)  # 1 row per sample before any observation
    monkeypatch.setattr(exact_rows, '_BUDGETS', {'cpu': device_budget})
    monkeypatch.setattr(type(call), 'device_type', property(lambda self: 'cuda'))
    first = segment._recompute_cancelled_rows(call, out, retained, 0.25)
    recomputed = torch.zeros(2, 8, dtype=torch.bool)
    recomputed[0, 5] = recomputed[1, 2] = True
    torch.testing.assert_close(first, torch.where(recomputed[:, None, :, None], reference, out))
    assert exact_rows.pop_inexact_rows().item() == 2 and exact_rows.pop_inexact_rows() is None
    second = segment._recompute_cancelled_rows(call, out, retained, 0.25)  # budget now 2 x the need of 3
    torch.testing.assert_close(second, torch.where((retained < 0.25)[:, None, :, None], reference, out))
    assert exact_rows.pop_inexact_rows().item() == 0
