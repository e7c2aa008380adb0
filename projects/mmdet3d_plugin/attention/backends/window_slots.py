"""Sparse products over per-query key slots, without gathering the keys.

Each query ``q`` of sample ``b`` owns ``L`` key slots ``index[b, q, :]`` (its
window keys), the same for every head. The window correction of the
``segment`` backend needs three products over them, for all samples and heads
at once:

* :meth:`SlotPattern.dot`: ``out[q, j] = a[q] . x[index[q, j]]`` (on the CPU a sampled
  dense-dense product: batched ``torch.sparse.sampled_addmm`` on a CSR pattern);
* :meth:`SlotPattern.weighted_sum`: ``out[q] = sum_j w[q, j] x[index[q, j]]``
  (one ``embedding_bag`` over the stacked per-(sample, head) key tables);
* :meth:`SlotPattern.scatter_add_`: ``out[k] += sum_{(q, j): index[q, j] = k} w[q, j] a[q]``
  (one ``embedding_bag`` over the inverse pattern: a bag per key).

On the CPU none of them writes a ``[Q, L, d]`` copy of the keys, and each is
one kernel call for the whole batch, which keeps the correction cheap. Off
the CPU :meth:`SlotPattern.dot` gathers the slots' keys instead (sparse CSR
tensors have no fake-tensor kernels, so that path could not be traced). All
products run in float32.
"""
import warnings
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


class SlotPattern:
    """The slot structure of one attention call.

    Args:
        index (Tensor): ``[bs, Q, L]`` long key index of every slot.
        num_keys (int): K.
        num_heads (int): heads sharing the pattern.
    """

    def __init__(self, index: Tensor, num_keys: int, num_heads: int) -> None:
        self.index = index
        self.num_keys, self.num_heads = num_keys, num_heads
        bs, num_queries, length = index.shape
        tables = bs * num_heads
        self._csr = self._sampled_pattern(index, num_keys, num_heads) if index.device.type == 'cpu' else None
        # row of key k of (sample b, head h) in the stacked [bs * heads * K, d] table
        table_start = (torch.arange(tables, device=index.device) * num_keys).view(bs, num_heads, 1, 1)
        self._bags = (index[:, None] + table_start).view(tables * num_queries, length)
        self._inverse: Optional[Tuple[Tensor, Tensor, Tensor]] = None

    @staticmethod
    def _sampled_pattern(index: Tensor, num_keys: int, num_heads: int) -> Tensor:
        """The slots as a batched CSR pattern ``[bs * heads, Q, max(K, L)]`` for ``sampled_addmm``."""
        bs, num_queries, length = index.shape
        tables = bs * num_heads
        # sampled_addmm fails when a pattern has more entries than its dense shape: widen tiny key sets
        crow = torch.arange(0, num_queries * length + 1, length, device=index.device).expand(tables, -1)
        columns = index.reshape(bs, 1, -1).expand(-1, num_heads, -1).reshape(tables, -1)
        values = torch.zeros(columns.shape, dtype=torch.float32, device=index.device)
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='Sparse CSR tensor support is in beta')
            return torch.sparse_csr_tensor(crow.contiguous(), columns, values,
                                           size=(tables, num_queries, max(num_keys, length)), check_invariants=False)

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

        On the CPU a batched ``sampled_addmm``; on other devices (CUDA) the
        slots' keys are gathered (``[bs, heads, Q * L, d]``) and multiplied, a
        fixed-shape kernel that traces under ``FakeTensorMode``. Both compute
        the same products (tested against each other on the CPU).
        """
        a = a.float() * scale if scale != 1.0 else a.float()
        if self._csr is None:
            return self.gathered_dot(a, x.float())
        bs, heads, num_queries, dim = a.shape
        x = x.float()
        num_columns = self._csr.size(-1)
        if num_columns > self.num_keys:
            x = F.pad(x, (0, 0, 0, num_columns - self.num_keys))
        out = torch.sparse.sampled_addmm(self._csr, a.reshape(-1, num_queries, dim),
                                         x.reshape(-1, num_columns, dim).transpose(1, 2), beta=0.0)
        return out.values().view(bs, heads, num_queries, -1)

    def gathered_dot(self, a: Tensor, x: Tensor) -> Tensor:
        """``a . x`` at the slots through a gathered copy of the slots' keys (the non-CPU :meth:`dot`)."""
        bs, heads, num_queries, dim = a.shape
        length = self.index.size(-1)
        index = self.index.reshape(bs, 1, -1, 1).expand(-1, heads, -1, dim)
        keys = torch.gather(x, 2, index).view(bs, heads, num_queries, length, dim)
        return torch.einsum('bhqd,bhqld->bhql', a, keys)

    def weighted_sum(self, weights: Tensor, x: Tensor) -> Tensor:
        """``sum_j weights[..., q, j] x[..., index[q, j], :]`` -> ``[bs, heads, Q, d]``."""
        bs, heads, num_queries, length = weights.shape
        out = F.embedding_bag(self._bags, x.float().reshape(-1, x.size(-1)),
                              per_sample_weights=weights.reshape(-1, length), mode='sum')
        return out.view(bs, heads, num_queries, -1)

    def scatter_add_(self, target: Tensor, weights: Tensor, a: Tensor, alpha: float = 1.0) -> None:
        """``target[..., k, :] += alpha * sum_{q, j: index[q, j] = k} weights[..., q, j] a[..., q, :]``.

        Args:
            target (Tensor): ``[bs, heads, K, d]`` float32, updated in place.
            weights (Tensor): ``[bs, heads, Q, L]``.
            a (Tensor): ``[bs, heads, Q, d]``.
            alpha (float): multiplier.
        """
        order, queries, offsets = self._inverse_pattern()
        sorted_weights = torch.gather(weights.reshape(order.shape[0], order.shape[1], -1), -1, order)
        out = F.embedding_bag(queries, a.float().reshape(-1, a.size(-1)), offsets=offsets,
                              per_sample_weights=sorted_weights.reshape(-1), mode='sum')
        target.add_(out.view(target.shape), alpha=alpha)
