"""The ``segment`` backend and the pieces only it is built from.

* :mod:`.backend`: :class:`SegmentBackend`, exact segment and window biases on
  bias-free fused kernels (the merge, the window correction, the backward);
* :mod:`.fused_lse`: the bias-free fused kernels that also return their
  log-sum-exp;
* :mod:`.exact_rows`: the exact recomputation of the rows whose window
  correction cancels, with its shape-only budget and the overflow count
  (:func:`pop_inexact_rows`, re-exported by ``attention``).

The window correction runs on the slot products of ``attention.slots``
(:class:`SlotPattern`, shared with the AQR local window attention).
"""
from .backend import SegmentBackend
from .exact_rows import ExactRowBudget, pop_inexact_rows

__all__ = ['SegmentBackend', 'ExactRowBudget', 'pop_inexact_rows']
