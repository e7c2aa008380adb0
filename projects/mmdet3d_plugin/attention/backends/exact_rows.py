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
* :class:`ExactRowBudget` sets the budget from the need it observed in
  earlier calls, read back asynchronously (pinned memory, a CUDA event polled
  with ``query()``: no synchronisation): ``headroom`` times the largest need
  of the last ``history`` observations, so a model that needs no
  recomputation pays nothing, and one that does gets the rows it needed
  recently. Until a first observation it uses ``initial_share`` of the
  queries. It sums the overflow on the device; the detector reports it in the
  training log (``segment_inexact_rows``, read when the log is, see
  :func:`pop_inexact_rows`).
"""
import collections
import math
import threading
from typing import Deque, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .base import AttentionCall, dense_additive_bias
from .math import reference_attention


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


class ExactRowBudget:
    """The recomputation budget of one accelerator, adapted to the observed need without host synchronisation.

    Args:
        initial_share (float): share of the queries recomputed before any need was observed.
        headroom (float): budget = ``ceil(headroom * largest recent need)``.
        history (int): how many of the latest observations the budget looks at.
    """

    def __init__(self, initial_share: float = 1.0 / 16, headroom: float = 2.0, history: int = 16) -> None:
        if not 0.0 <= initial_share <= 1.0 or headroom < 1.0 or history < 1:
            raise ValueError(f'ExactRowBudget needs 0 <= initial_share <= 1, headroom >= 1 and history >= 1; got '
                             f'{initial_share}, {headroom}, {history}')
        self.initial_share, self.headroom = initial_share, headroom
        self.needs: Deque[int] = collections.deque(maxlen=history)
        self._pending: List[Tuple[Tensor, object]] = []
        self._inexact: Optional[Tensor] = None
        self._lock = threading.Lock()

    def budget(self, num_queries: int) -> int:
        """Rows per sample to recompute in the next call of ``num_queries`` queries."""
        self._collect()
        if not self.needs:
            return math.ceil(num_queries * self.initial_share)
        return min(num_queries, math.ceil(self.headroom * max(self.needs)))

    def record(self, needed: Tensor, overflow: Tensor) -> None:
        """Note a call's need (``[bs]`` flagged rows per sample) and overflow (``[bs]``), both on the device.

        The need is copied to pinned host memory without blocking and read by a later :meth:`budget` once the
        copy has finished; a CPU need (the tests of this logic) is read at once.
        """
        if torch._guards.detect_fake_mode() is not None:  # traced on fake CUDA: nothing to count or read back
            return
        with self._lock:
            total = overflow.sum()
            self._inexact = total if self._inexact is None else self._inexact + total
        peak = needed.max()
        if peak.device.type == 'cpu':
            self.needs.append(int(peak))
            return
        host = torch.empty((), dtype=peak.dtype, pin_memory=True)
        host.copy_(peak, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((host, event))

    def _collect(self) -> None:
        """Move the observations whose copies have finished into :attr:`needs` (never waits)."""
        while self._pending and self._pending[0][1].query():
            host, _ = self._pending.pop(0)
            self.needs.append(int(host))

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
