"""Exact recomputation of the rows where ``segment``'s window correction cancels most of the mass.

``segment`` adds a window correction ``c_j = e^{x_j + g_j}(e^{w_j} - 1)`` to
the bias-free normaliser; where a very negative window bias removes most of
a row's mass, that subtraction loses precision, so such rows (those keeping
less than ``tolerance`` of their mass) are recomputed with the reference
over all keys. How many rows of a sample need it is data: on the CPU it is
read (free there); on an accelerator reading it would make the host wait for
the device, so a **budget** of rows per sample is recomputed instead:

* :func:`recompute_rows` recomputes, per sample, the ``budget`` flagged rows
  that keep the smallest share of their mass and returns how many flagged
  rows it had to leave (the **overflow**; their outputs are the merge's, with
  the cancellation error, never a crash);
* :class:`ExactRowBudget` sets the budget from the call's shapes alone, so
  the same call recomputes the same rows on every run: ``share`` of the
  queries, at most as many rows as keep one sample's ``[1, heads, rows, K]``
  float32 score block within :data:`EXACT_ROWS_MAX_ELEMENTS` (at least one
  row while ``share > 0``). It sums the overflow on the device; the detector
  reports it in the training log (``segment_inexact_rows``, read when the log
  is, see :func:`pop_inexact_rows`).
"""
import math
import threading
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from ..base import AttentionCall, dense_additive_bias
from ..math import reference_attention


def recompute_rows(call: AttentionCall, out: Tensor, retained: Tensor, tolerance: float,
                   budget: int) -> Tuple[Tensor, Tensor]:
    """Replace up to ``budget`` flagged queries per sample by the reference computed over all keys.

    Args:
        call (AttentionCall): the call.
        out (Tensor): ``[bs, heads, Q, d]`` output of the merge.
        retained (Tensor): ``[bs, Q]`` share of its mass each query keeps
            after the window correction (smallest over the heads).
        tolerance (float): a query with ``retained < tolerance`` is flagged.
        budget (int): queries per sample that are recomputed (``0``: none).

    Returns:
        tuple[Tensor, Tensor]: ``out`` with the recomputed queries replaced
        (differentiable, fixed-size work for a given budget: the ``budget``
        queries of each sample with the smallest retained share are
        recomputed and written back where flagged), and ``[bs]`` long: the
        flagged queries of each sample left as they were (overflow).
    """
    flags = retained < tolerance
    budget = min(budget, flags.size(-1))
    overflow = (flags.sum(-1) - budget).clamp_(min=0)
    if budget == 0:
        return out, overflow
    picked = retained.topk(budget, -1, largest=False, sorted=False).indices
    heads = torch.arange(out.size(1), device=out.device)
    for batch in range(out.size(0)):
        queries = picked[batch]
        padding = call.key_padding_mask[batch:batch + 1] if call.key_padding_mask is not None else None
        bias = dense_additive_bias(call.bias.select_queries(batch, queries), padding, torch.float32)
        exact = reference_attention(call.q[batch:batch + 1, :, queries], call.k[batch:batch + 1],
                                    call.v[batch:batch + 1], bias, call.scale)[0]
        index = (torch.full_like(queries, batch)[None], heads[:, None], queries[None])
        exact = torch.where(flags[batch, queries][None, :, None], exact.to(out.dtype), out[index])
        out = out.index_put(index, exact)
    return out, overflow


#: the largest ``[1, heads, rows, K]`` float32 score block the recomputation of one sample may make: 2**24
#: elements, 64 MiB (at VoV's 56 400 keys and 8 heads: 37 rows; uncapped, all 900 would take 1.6 GB)
EXACT_ROWS_MAX_ELEMENTS = 2**24


class ExactRowBudget:
    """The recomputation budget of one accelerator, a function of the call's shapes, and its overflow count.

    Args:
        share (float): share of the queries recomputed per sample (before the cap).
        max_elements (int): cap on one sample's ``[1, heads, rows, K]`` float32 score block.
    """

    def __init__(self, share: float = 1.0 / 16, max_elements: int = EXACT_ROWS_MAX_ELEMENTS) -> None:
        if not 0.0 <= share <= 1.0 or max_elements < 1:
            raise ValueError(f'ExactRowBudget needs 0 <= share <= 1 and max_elements >= 1; got {share}, '
                             f'{max_elements}')
        self.share, self.max_elements = share, max_elements
        self._inexact: Optional[Tensor] = None
        self._lock = threading.Lock()

    def budget(self, num_queries: int, num_heads: int, num_keys: int) -> int:
        """Rows per sample to recompute in a call of ``num_queries`` queries, ``num_heads`` heads, ``num_keys`` keys.

        ``min(ceil(share * Q), max_elements // (heads * K))``, at least 1 while ``share > 0``: the same for every
        call of these shapes, whatever the data.
        """
        if self.share == 0 or num_queries == 0:
            return 0
        fitting = self.max_elements // max(1, num_heads * num_keys)
        return max(1, min(math.ceil(self.share * num_queries), fitting))

    def record(self, overflow: Tensor) -> None:
        """Add a call's overflow (``[bs]`` flagged rows per sample left inexact) to the sum, on the device."""
        if torch._guards.detect_fake_mode() is not None:  # traced on fake CUDA: nothing to count
            return
        with self._lock:
            total = overflow.sum()
            self._inexact = total if self._inexact is None else self._inexact + total

    def pop_inexact(self) -> Optional[Tensor]:
        """The overflow summed since the last call (a device scalar), or None if nothing was recorded."""
        with self._lock:
            inexact, self._inexact = self._inexact, None
        return inexact


_BUDGETS: Dict[str, ExactRowBudget] = {}


def budget_of(device: torch.device) -> ExactRowBudget:
    """The :class:`ExactRowBudget` of a device (one per device, made on first use)."""
    key = str(device)
    if key not in _BUDGETS:
        _BUDGETS[key] = ExactRowBudget()
    return _BUDGETS[key]


def pop_inexact_rows() -> Optional[Tensor]:
    """Rows left inexact (overflow) on any accelerator since the last call, as a device scalar; None if none ran.

    The training step adds it to its log variables, so it is read only when the log is (no extra synchronisation).
    """
    totals = [budget.pop_inexact() for budget in list(_BUDGETS.values())]
    totals = [total for total in totals if total is not None]
    return sum(totals[1:], totals[0]) if totals else None
