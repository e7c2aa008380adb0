"""The CPU's ``'sparse'`` slot products read split-head key tables without copying them.

The attention modules pass the keys and values as split-head views of
``[bs, K, heads, d]`` tensors; ``dot`` and ``weighted_sum`` read them through
their ``[bs * K * heads, d]`` row table (``window_slots.key_major_rows``), so
no op allocates a tensor the size of the key table.
"""
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from projects.mmdet3d_plugin.attention.slots.window_slots import SlotPattern
from test_window_slots_gather import _split_heads


class _LargestAllocation(TorchDispatchMode):
    """The most elements of any new tensor an op returns (views of its inputs do not count)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.layout == torch.strided]
        storages = {t.untyped_storage().data_ptr() for t in inputs}
        for result in pytree.tree_leaves(out):
            if (isinstance(result, torch.Tensor) and result.layout == torch.strided
                    and result.untyped_storage().data_ptr() not in storages):
                self.largest = max(self.largest, result.numel())
        return out


def test_the_sparse_products_read_split_head_key_tables_without_copying_them():
    """Many keys, few slots: no op of ``dot`` / ``weighted_sum`` returns a tensor as large as the key table."""
    bs, heads, num_queries, length, num_keys, dim = 2, 4, 5, 6, 4000, 8
    index = torch.randint(0, num_keys, (bs, num_queries, length))
    pattern = SlotPattern(index, num_keys, heads, formulation='sparse')
    a = _split_heads(torch.randn(bs, heads, num_queries, dim))
    x = _split_heads(torch.randn(bs, heads, num_keys, dim))
    weights = torch.randn(bs, heads, num_queries, length)
    with _LargestAllocation() as mode:
        scores = pattern.dot(a, x, 0.5)
        summed = pattern.weighted_sum(weights, x)
    assert mode.largest < x.numel()
    rows = x[torch.arange(bs)[:, None, None, None], torch.arange(heads)[None, :, None, None], index[:, None]]
    torch.testing.assert_close(scores, 0.5 * torch.einsum('bhqd,bhqld->bhql', a, rows))
    torch.testing.assert_close(summed, torch.einsum('bhql,bhqld->bhqd', weights, rows))
