"""How many ops a piece of code sends to a device: a measure of launch-bound code that needs no GPU.

Where a GPU waits for the host (small tensors, many ops), time follows the
number of kernels launched. :class:`DeviceOpCounter` counts them inside a
``FakeTensorMode`` on fake CUDA tensors: every dispatched op that reads or
writes a tensor of the device and is not a view, a metadata query or an
allocation, i.e. what becomes a kernel launch (or a device-side copy) on a
GPU. Copies of host data to the device are counted apart: a model's
constants come from :func:`~.host_data.device_constant`, which copies them
once per run on a GPU but every time under ``FakeTensorMode`` (fake tensors
are not cached), so they would otherwise inflate the count.

A count is a property of the code, not a time: use it to compare two
formulations of the same thing (``tools/count_device_ops.py``).
"""
import contextlib
from collections import Counter
from typing import Iterator, List

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .host_data import host_copy_of

#: ops that run no kernel: allocations, and a view whose schema does not say it is one (``reshape``'s)
_NO_KERNEL = frozenset(['aten::empty', 'aten::empty_strided', 'aten::empty_like', 'aten::new_empty',
                        'aten::new_empty_strided', 'aten::_unsafe_view'])
#: the name :attr:`DeviceOpCounter.ops` counts every op under
TOTAL = 'total'


def _is_view(func) -> bool:
    """Whether ``func`` returns an alias of an input without writing it (``view``, ``transpose``, ``expand`` ...)."""
    return any(ret.alias_info is not None and not ret.alias_info.is_write for ret in func._schema.returns)


class DeviceOpCounter(TorchDispatchMode):
    """Count the ops dispatched inside the mode that run work on ``device``, in total and per named part.

    Args:
        device (str): the device type whose work counts (default ``'cuda'``).

    Attributes:
        ops (Counter[str]): device ops per part (:meth:`part`, :meth:`hook`), nested parts counted in each
            enclosing part too, and every op under :data:`TOTAL`.
        host_copies (Counter[str]): copies of host data to the device, the same way.
        op_names (Counter[str]): the total per op name (``aten::add`` ...).
    """

    def __init__(self, device: str = 'cuda') -> None:
        super().__init__()
        self.device_type = torch.device(device).type
        self.ops: Counter = Counter()
        self.host_copies: Counter = Counter()
        self.op_names: Counter = Counter()
        self._open: List[str] = []

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Count the ops run inside the block under ``name`` too."""
        self._open.append(name)
        try:
            yield
        finally:
            self._open.remove(name)

    def hook(self, name: str, module: nn.Module) -> None:
        """Count the ops of every forward of ``module`` under ``name`` too."""
        module.register_forward_pre_hook(lambda *_: self._open.append(name))
        module.register_forward_hook(lambda *_: self._open.remove(name))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name
        if func.namespace == 'prim' or name in _NO_KERNEL or _is_view(func):
            return out
        if not any(isinstance(t, Tensor) and t.device.type == self.device_type
                   for t in tree_flatten((args, kwargs, out))[0]):
            return out
        counter = self.ops if host_copy_of(func, args, kwargs) is None else self.host_copies
        if counter is self.ops:
            self.op_names[name] += 1
        for part in (TOTAL, *self._open):
            counter[part] += 1
        return out
