"""Sparse products over per-query key slots: what the ``segment`` backend and the AQR local window attention share.

:class:`SlotPattern` (:mod:`.window_slots`) holds each query's ``L`` key slots
``index [bs, Q, L]`` and computes, for all samples and heads at once, ``dot``
(``[bs, heads, Q, L]``), ``weighted_sum`` (``[bs, heads, Q, d]``) and
``scatter_add_`` (into ``[bs, heads, K, d]``) in one of four formulations,
chosen per device type (:data:`FORMULATIONS`): ``'cpp'`` (:mod:`.cpu_slot_dot`,
the C++ kernel of ``slot_dot_cpu.cpp``), ``'sparse'``, ``'gather'`` and
``'triton'`` (:mod:`.slot_kernels`, behind the custom operators of
:mod:`.slot_ops`). Users: the window correction of ``backends/segment`` and
``models/aqr/local_window.py``.
"""
from .window_slots import (FORMULATION_NAMES, FORMULATIONS, SlotPattern, default_formulation, formulation_override,
                           set_formulation)

__all__ = [
    'FORMULATION_NAMES', 'FORMULATIONS', 'SlotPattern', 'default_formulation', 'formulation_override',
    'set_formulation'
]
