"""Sparse products over per-query key slots, without copying the key tables.

Each query ``q`` of sample ``b`` owns ``L`` key slots ``index[b, q, :]`` (its window keys), the same for
every head. The ``segment`` backend's window correction and the AQR local window attention need three
products over them for all samples and heads at once (``a`` ``[bs, heads, Q, d]``, ``x`` ``[bs, heads, K, d]``,
``w`` ``[bs, heads, Q, L]``):

* :meth:`SlotPattern.dot`: ``out[q, j] = a[q] . x[index[q, j]]``;
* :meth:`SlotPattern.weighted_sum`: ``out[q] = sum_j w[q, j] x[index[q, j]]``;
* :meth:`SlotPattern.scatter_add_`: ``out[k] += sum_{(q, j): index[q, j] = k} w[q, j] a[q]``.

Four formulations compute them (``formulation=``, default per device type in :data:`FORMULATIONS`):

* ``'cpp'`` (CPU, where setup built :mod:`.cpu_slot_dot`): ``dot`` is that C++ kernel, reading the
  :func:`key_major_rows` table; ``weighted_sum`` and ``scatter_add_`` as in ``'sparse'``.
* ``'sparse'`` (CPU without the C++ kernel): one ``torch.sparse.sampled_addmm`` / ``embedding_bag`` per product
  on a CSR pattern (its inverse for ``scatter_add_``), keys read through :func:`key_major_rows`, so no key table
  is copied. Slow off the CPU: every invalid slot points at one key, whose bag is reduced serially.
* ``'gather'`` (other devices, CUDA without Triton): the slots' rows gathered from ``x``'s own view in chunks
  of queries (:data:`GATHER_MAX_ELEMENTS`), one batched product per chunk; ``scatter_add_`` spreads dead slots
  as :meth:`SlotPattern.routed_index` says. Shapes depend on sizes only: no host synchronisation.
* ``'triton'`` (CUDA with Triton; CPU tests under ``TRITON_INTERPRET=1``): the fused kernels of :mod:`.slot_kernels`
  (custom operators in :mod:`.slot_ops`) load the slots' rows by index and reduce them in registers.

All products run in float32; the formulations agree up to float32 rounding (tested against each other).
"""
import contextlib
import warnings
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..triton_device import triton_not_supported_reasons
from . import cpu_slot_dot, slot_ops

#: formulation of the products per device type; a device type not listed takes ``'gather'``, and so does one
#: listed with ``'triton'`` where Triton cannot run; ``'cpp'`` falls back to ``'sparse'`` where the C++ kernel is
#: not built. Tests force ``'gather'`` / ``'triton'`` on the CPU through it, and a benchmark can set another
#: formulation (``tools/benchmark_attention.py --slot-formulation``)
FORMULATIONS = {'cpu': 'cpp', 'cuda': 'triton'}
#: the formulations :class:`SlotPattern` knows
FORMULATION_NAMES = ('cpp', 'sparse', 'gather', 'triton')
#: most elements of one gathered ``[bs, heads, chunk * L, d]`` float32 block of the ``'gather'`` formulation
#: (2^25: 128 MiB); the queries are processed in chunks of at least one query that stay within it
GATHER_MAX_ELEMENTS = 2**25


def set_formulation(device: torch.device, formulation: str) -> None:
    """Make ``formulation`` the default of ``device``'s type (``tools/benchmark_*.py --slot-formulation``)."""
    if formulation not in FORMULATION_NAMES:
        raise ValueError(f'formulation must be one of {FORMULATION_NAMES}, got {formulation!r}')
    FORMULATIONS[torch.device(device).type] = formulation


@contextlib.contextmanager
def formulation_override(device: torch.device, formulation: str) -> Iterator[None]:
    """Within the block, ``formulation`` is the default of ``device``'s type (restored afterwards)."""
    device_type = torch.device(device).type
    missing = object()
    previous = FORMULATIONS.get(device_type, missing)
    set_formulation(device, formulation)
    try:
        yield
    finally:
        if previous is missing:
            del FORMULATIONS[device_type]
        else:
            FORMULATIONS[device_type] = previous


def default_formulation(device: torch.device) -> str:
    """The formulation :class:`SlotPattern` uses on ``device`` unless told (:data:`FORMULATIONS`; ``'gather'``
    instead of a ``'triton'`` entry where Triton cannot run, e.g. a CUDA machine without the triton package, and
    ``'sparse'`` instead of ``'cpp'`` where the C++ kernel is not built)."""
    device_type = torch.device(device).type
    formulation = FORMULATIONS.get(device_type, 'gather')
    if formulation == 'triton' and triton_not_supported_reasons(device_type, 'the slot kernels'):
        return 'gather'
    if formulation == 'cpp' and _cpp_not_supported_reasons(device_type):
        return 'sparse'
    return formulation


def _cpp_not_supported_reasons(device_type: str) -> List[str]:
    """Why the ``'cpp'`` formulation cannot run on ``device_type`` tensors (empty when it can)."""
    reasons = [] if device_type == 'cpu' else [f"the 'cpp' slot products run on CPU tensors, got {device_type} tensors"]
    return reasons + cpu_slot_dot.not_available_reasons()


class SlotPattern:
    """The slot structure of one attention call.

    Args:
        index (Tensor): ``[bs, Q, L]`` long key index of every slot.
        num_keys (int): K.
        num_heads (int): heads sharing the pattern.
        valid (Tensor, optional): ``[bs, Q, L]`` bool, False for a slot that
            must contribute nothing (clipped window cell, invisible query,
            padded key). The callers already give such slots the weight 0,
            which is what the ``'sparse'`` formulation relies on; the
            ``'gather'`` formulation also zeroes their weights and routes them
            away from the key their index names (see the module docstring).
        formulation (str, optional): one of :data:`FORMULATION_NAMES`;
            default :func:`default_formulation` of the index's device.
    """

    def __init__(self, index: Tensor, num_keys: int, num_heads: int, valid: Optional[Tensor] = None,
                 formulation: Optional[str] = None) -> None:
        self.index = index
        self.num_keys, self.num_heads = num_keys, num_heads
        self.valid = valid
        self.formulation = default_formulation(index.device) if formulation is None else formulation
        if self.formulation not in FORMULATION_NAMES:
            raise ValueError(f'formulation must be one of {FORMULATION_NAMES}, got {self.formulation!r}')
        reasons = []
        if self.formulation == 'triton':
            reasons = triton_not_supported_reasons(index.device.type, "the 'triton' slot products")
        elif self.formulation == 'cpp':
            reasons = _cpp_not_supported_reasons(index.device.type)
        if reasons:
            raise ValueError('; '.join(reasons))
        self._csr = self._columns = self._inverse = self._spread = None
        # the Triton kernels load the validity as bytes: converted once here, not in every product
        self._valid_bytes = valid.to(torch.uint8) if self.formulation == 'triton' and valid is not None else None
        if self.formulation in ('sparse', 'cpp'):
            self._columns = self._slot_columns(index, num_keys, num_heads)
            if self.formulation == 'sparse' and index.device.type == 'cpu':
                self._csr = self._sampled_pattern(self._columns, index.size(0) * num_keys * num_heads)

    @staticmethod
    def _slot_columns(index: Tensor, num_keys: int, num_heads: int) -> Tensor:
        """The row of every slot's key in the :func:`key_major_rows` table: ``[bs * heads * Q, L]``, row
        ``(b, h, q)`` holding ``(b * K + index[b, q, j]) * heads + h``."""
        bs, num_queries, length = index.shape
        heads = torch.arange(num_heads, device=index.device).view(1, num_heads, 1, 1)
        sample_start = (torch.arange(bs, device=index.device) * num_keys).view(bs, 1, 1)
        return (((index + sample_start) * num_heads)[:, None] + heads).view(-1, length)

    @staticmethod
    def _sampled_pattern(columns: Tensor, num_columns: int) -> Tensor:
        """The slots as the crow and column indices of one CSR pattern ``[bs * heads * Q, max(bs * K * heads, L)]``
        (see :meth:`_sampled_dot`)."""
        rows, length = columns.shape
        crow = torch.arange(0, rows * length + 1, length, device=columns.device)
        # sampled_addmm fails when a row has more entries than the pattern has columns: widen tiny key sets
        return crow, columns.view(-1), (rows, max(num_columns, length))

    def _inverse_pattern(self) -> Tuple[Tensor, Tensor, Tensor]:
        """Slots sorted by key: their order ``[bs, heads, Q*L]``, their stacked query rows and each bag's start."""
        if self._inverse is None:
            bs, num_queries, length = self.index.shape
            flat = self.index.reshape(bs, -1)
            order = torch.argsort(flat, dim=-1, stable=True)
            starts = torch.searchsorted(torch.gather(flat, -1, order),
                                        torch.arange(self.num_keys, device=flat.device).expand(bs, -1).contiguous())
            tables = torch.arange(bs * self.num_heads, device=flat.device).view(bs, self.num_heads, 1)
            queries = (order // length)[:, None] + tables * num_queries
            offsets = starts[:, None] + tables * (num_queries * length)
            self._inverse = (order[:, None].expand(-1, self.num_heads, -1), queries.reshape(-1), offsets.reshape(-1))
        return self._inverse

    def dot(self, a: Tensor, x: Tensor, scale: float = 1.0) -> Tensor:
        """``scale * a . x`` at the slots: ``[bs, heads, Q, d]``, ``[bs, heads, K, d]`` -> ``[bs, heads, Q, L]``.

        ``'cpp'``: the C++ kernel; ``'sparse'`` on the CPU: one
        ``sampled_addmm``; ``'triton'``: the Triton kernel; otherwise the
        slots' keys are gathered in chunks of queries and multiplied, a
        fixed-shape kernel that traces under ``FakeTensorMode``. All compute
        the same products (tested against each other on the CPU). Invalid
        slots get ``a . x[index]`` like any other: callers mask them.
        """
        if self.formulation == 'triton':
            return slot_ops.slot_dot(self.index, a, x, scale)
        if self.formulation == 'cpp':
            out = cpu_slot_dot.slot_dot(a.float().reshape(-1, a.size(-1)), key_major_rows(x.float()), self._columns,
                                        scale)
            return out.view(*a.shape[:3], -1)
        a = a.float() * scale if scale != 1.0 else a.float()
        if self._csr is None:
            return self.gathered_dot(a, x)
        return self._sampled_dot(a, x)

    def _sampled_dot(self, a: Tensor, x: Tensor) -> Tensor:
        """:meth:`dot` as one ``sampled_addmm`` of the ``[bs * heads * Q, d]`` rows of ``a`` and the
        :func:`key_major_rows` table of ``x``, written into a pattern of fresh values that shares the slots' indices
        (``out=`` the pattern itself: no copy of the indices)."""
        crow, columns, size = self._csr
        table = key_major_rows(x.float())
        if size[1] > table.size(0):
            table = F.pad(table, (0, 0, 0, size[1] - table.size(0)))
        values = torch.zeros(columns.shape, dtype=torch.float32, device=columns.device)  # beta=0 still reads them
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='Sparse CSR tensor support is in beta')
            pattern = torch.sparse_csr_tensor(crow, columns, values, size=size, check_invariants=False)
        torch.sparse.sampled_addmm(pattern, a.reshape(-1, a.size(-1)), table.t(), beta=0.0, out=pattern)
        return values.view(*a.shape[:3], -1)

    def gathered_dot(self, a: Tensor, x: Tensor) -> Tensor:
        """``a . x`` at the slots through gathered copies of the slots' keys, chunk by chunk of queries."""
        a = a.float()
        return _cat_queries([torch.einsum('bhqd,bhqld->bhql', a[:, :, start:end], self._gather_rows(x, start, end))
                             for start, end in self._chunks(a.size(1), a.size(-1))])

    def weighted_sum(self, weights: Tensor, x: Tensor) -> Tensor:
        """``sum_j weights[..., q, j] x[..., index[q, j], :]`` -> ``[bs, heads, Q, d]``."""
        bs, heads, num_queries, length = weights.shape
        if self.formulation == 'triton':
            return slot_ops.slot_weighted_sum(self.index, self._valid_bytes, weights, x)
        if self.formulation == 'gather':
            weights = self._live_weights(weights.float())
            return _cat_queries([
                torch.einsum('bhql,bhqld->bhqd', weights[:, :, start:end], self._gather_rows(x, start, end))
                for start, end in self._chunks(heads, x.size(-1))])
        out = F.embedding_bag(self._columns, key_major_rows(x.float()), per_sample_weights=weights.reshape(-1, length),
                              mode='sum')
        return out.view(bs, heads, num_queries, -1)

    def scatter_add_(self, target: Tensor, weights: Tensor, a: Tensor, alpha: float = 1.0) -> None:
        """``target[..., k, :] += alpha * sum_{q, j: index[q, j] = k} weights[..., q, j] a[..., q, :]``.

        Args:
            target (Tensor): ``[bs, heads, K, d]`` float32, updated in place (any strides).
            weights (Tensor): ``[bs, heads, Q, L]``.
            a (Tensor): ``[bs, heads, Q, d]``.
            alpha (float): multiplier.
        """
        if self.formulation == 'triton':
            slot_ops.slot_scatter_add_(self.index, self._valid_bytes, target, weights, a, alpha)
            return
        if self.formulation == 'gather':
            self._gathered_scatter_add_(target, weights, a, alpha)
            return
        order, queries, offsets = self._inverse_pattern()
        sorted_weights = torch.gather(weights.reshape(order.shape[0], order.shape[1], -1), -1, order)
        out = F.embedding_bag(queries, a.float().reshape(-1, a.size(-1)), offsets=offsets,
                              per_sample_weights=sorted_weights.reshape(-1), mode='sum')
        target.add_(out.view(target.shape), alpha=alpha)

    # the 'gather' formulation

    def _chunks(self, heads: int, dim: int) -> List[Tuple[int, int]]:
        """Query ranges whose gathered ``[bs, heads, chunk * L, dim]`` block has at most :data:`GATHER_MAX_ELEMENTS`
        elements (at least one query each): a function of the shapes alone."""
        bs, num_queries, length = self.index.shape
        size = max(1, GATHER_MAX_ELEMENTS // max(1, bs * heads * length * dim))
        return [(start, min(start + size, num_queries)) for start in range(0, num_queries, size)]

    def _gather_rows(self, x: Tensor, start: int, end: int) -> Tensor:
        """The rows of the slots of queries ``start:end``: ``[bs, heads, end - start, L, d]`` float32, gathered from
        ``x`` ``[bs, heads, K, d]`` as it is (no contiguous or float32 copy of the table)."""
        bs, heads, _, dim = x.shape
        length = self.index.size(-1)
        index = self.index[:, start:end].reshape(bs, 1, -1, 1).expand(-1, heads, -1, dim)
        return torch.gather(x, 2, index).view(bs, heads, end - start, length, dim).float()

    def _live_weights(self, weights: Tensor) -> Tensor:
        """``weights`` with the invalid slots' set to 0 (unchanged when the pattern has no ``valid``)."""
        return weights if self.valid is None else weights.masked_fill(~self.valid[:, None], 0.0)

    def routed_index(self, weights: Tensor, start: int = 0, end: Optional[int] = None) -> Tensor:
        """The key each slot of queries ``start:end`` is added to by the ``'gather'`` :meth:`scatter_add_`.

        A slot with a non-zero weight keeps its key; a slot whose (live)
        weight is exactly 0 adds exactly 0, so it goes to key
        ``(q * L + j) mod K`` instead, which spreads these no-op adds evenly
        over the keys (at most ``ceil(Q * L / K)`` per key and table).

        Args:
            weights (Tensor): ``[bs, heads, end - start, L]`` float32 weights, invalid slots already zeroed.

        Returns:
            Tensor: ``[bs, heads, end - start, L]`` long.
        """
        num_queries, length = self.index.shape[1:]
        end = num_queries if end is None else end
        if self._spread is None:
            self._spread = torch.arange(num_queries * length, device=self.index.device).remainder_(
                self.num_keys).view(num_queries, length)
        return torch.where(weights != 0, self.index[:, None, start:end], self._spread[start:end])

    def _gathered_scatter_add_(self, target: Tensor, weights: Tensor, a: Tensor, alpha: float) -> None:
        """:meth:`scatter_add_` as one ``scatter_add_`` per chunk of queries into ``target``'s own view."""
        heads, dim = a.size(1), a.size(-1)
        weights = self._live_weights(weights.float())
        if alpha != 1.0:
            weights = weights * alpha
        a = a.float()
        for start, end in self._chunks(heads, dim):
            chunk = weights[:, :, start:end]
            index = self.routed_index(chunk, start, end).flatten(2)[..., None].expand(-1, -1, -1, dim)
            contributions = (chunk[..., None] * a[:, :, start:end, None]).flatten(2, 3)
            target.scatter_add_(2, index, contributions)


def key_major_rows(x: Tensor) -> Tensor:
    """``[bs, heads, n, d]`` as the ``[bs * n * heads, d]`` table of its rows in ``(b, n, h)`` order.

    Free (a view) for the layout the attention modules have, a ``[bs, n, heads, d]`` tensor with its heads split
    off by ``transpose(1, 2)``; a copy otherwise.
    """
    return x.transpose(1, 2).reshape(-1, x.size(-1))


def _cat_queries(chunks: List[Tensor]) -> Tensor:
    """Chunks of queries (dim 2) back into one tensor (no copy for a single chunk)."""
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks, 2)
