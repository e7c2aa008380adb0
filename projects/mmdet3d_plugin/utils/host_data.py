"""Host data on a device without a host synchronisation, and the tools that check it.

A blocking copy of host memory to a CUDA device (``torch.tensor(python_list,
device='cuda')``, ``x.new_tensor(list)``, ``numpy_tensor.to('cuda')``) is a
pageable copy followed by a stream synchronisation: the host waits for every
kernel queued before it. In a training step that makes the CPU wait for the
GPU dozens of times. The model's code therefore brings host data to a device
only through these functions:

* :func:`device_constant`: values fixed for a run (a point-cloud range,
  code weights, a window stencil), copied once per (values, dtype, device) and
  cached; :func:`device_table` the same for a larger table made on the host,
  cached per (name, device);
* :func:`host_to_device`: per-batch host data (``img_metas`` matrices and
  shapes, assignment indices), copied from pinned memory without blocking.

:func:`permitted_host_sync` marks the few places that must wait for the
device (the Hungarian matching runs on the host), so that
``torch.cuda.set_sync_debug_mode('error')`` (``tools/check_gpu.py``) accepts
them and catches every other synchronisation. :class:`HostCopyCounter`
counts blocking host-to-device copies on fake CUDA, where a GPU is absent;
:class:`SyncingOpRecorder` records, on any device, the ops that make the host
wait when they run on CUDA (a backward that indexes with a boolean mask, say).
"""
import contextlib
import threading
import traceback
from typing import Callable, Dict, Hashable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_CONSTANTS: Dict[Tuple, Tensor] = {}
_CONSTANTS_LOCK = threading.Lock()


def _is_fake(device: torch.device) -> bool:
    """Whether tensors made now are fake (``FakeTensorMode``, or a compiler tracing): they must not be cached or
    pinned. Asks the dispatcher's fake-mode slot directly: ``torch._guards.detect_fake_mode()`` walks the mode stack
    and costs more than the small constants it guards."""
    return (torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
            or torch._guards.TracingContext.try_get() is not None
            or (device.type == 'cuda' and not torch.cuda.is_available()))


def host_to_device(data, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> Tensor:
    """Copy host data (numbers, nested lists, a numpy array or a CPU tensor) to ``device`` without blocking.

    On the CPU this is ``torch.as_tensor``. On an accelerator the data is put
    in pinned memory and copied asynchronously (the caching host allocator
    keeps the pinned block until the copy has finished), so the host does not
    wait for the device.

    Args:
        data: host data of any shape.
        device (torch.device, optional): target device (default CPU).
        dtype (torch.dtype, optional): dtype of the result (default: inferred).

    Returns:
        Tensor: the data on ``device``.
    """
    device = torch.device('cpu') if device is None else torch.device(device)
    host = torch.as_tensor(np.asarray(data) if isinstance(data, (list, tuple)) else data, dtype=dtype)
    if device.type == 'cpu':
        return host
    if host.device.type != 'cpu':
        return host.to(device)
    if not _is_fake(device):
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


def device_constant(values: Sequence, device: Optional[torch.device] = None,
                    dtype: Optional[torch.dtype] = None) -> Tensor:
    """A constant tensor of ``values`` on ``device``, copied to it once and then served from a cache.

    The cached tensor is made outside inference mode (usable in autograd
    later) and must not be modified in place by callers.

    Args:
        values (Sequence): numbers or nested sequences of numbers (hashable once converted to tuples).
        device (torch.device, optional): target device (default CPU).
        dtype (torch.dtype, optional): dtype of the result (default: inferred).

    Returns:
        Tensor: ``values`` as a tensor on ``device``.
    """
    return _cached_on_device(('values', _freeze(values), dtype), lambda: values, device, dtype)


def device_table(name: Hashable, make: Callable[[], np.ndarray], device: Optional[torch.device] = None) -> Tensor:
    """A constant table made on the host by ``make()``, copied to ``device`` once and then served from a cache.

    For constants too large to be keyed by their values (:func:`device_constant`): ``name`` must determine what
    ``make`` returns (e.g. the shapes it is built from). ``make`` runs once per (name, device); under
    ``FakeTensorMode`` on every call (fake tensors are not cached). The cached tensor must not be modified in
    place by callers.

    Args:
        name (Hashable): what the table is, e.g. ``('tiled_bias_key_cells', grids, bounds, num_keys)``.
        make (Callable[[], np.ndarray]): builds the table on the host (a numpy array or a CPU tensor).
        device (torch.device, optional): target device (default CPU).

    Returns:
        Tensor: the table on ``device``, in the dtype ``make`` gives it.
    """
    return _cached_on_device(('table', name), make, device, None)


def _cached_on_device(key: Tuple, make: Callable, device: Optional[torch.device],
                      dtype: Optional[torch.dtype]) -> Tensor:
    """``make()`` on ``device`` (in ``dtype``), made once per (key, device) and cached (every call when fake)."""
    device = torch.device('cpu') if device is None else torch.device(device)
    if _is_fake(device):
        return host_to_device(make(), device, dtype)
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    key = key + (str(device), )
    with _CONSTANTS_LOCK:
        cached = _CONSTANTS.get(key)
        if cached is None:
            with torch.inference_mode(False), torch.no_grad():
                cached = host_to_device(make(), device, dtype)
            _CONSTANTS[key] = cached
    return cached


def _freeze(values):
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, (list, tuple)):
        return tuple(_freeze(value) for value in values)
    return values


_PERMITTED = threading.local()


@contextlib.contextmanager
def permitted_host_sync() -> Iterator[None]:
    """Allow a deliberate host synchronisation under ``torch.cuda.set_sync_debug_mode``.

    Inside the block the sync-debug mode is off; it is restored afterwards.
    :class:`SyncingOpRecorder` does not record the ops run inside it, on any
    device.
    """
    _PERMITTED.depth = getattr(_PERMITTED, 'depth', 0) + 1
    mode = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
    try:
        if mode == 0:
            yield
            return
        torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(mode)
    finally:
        _PERMITTED.depth -= 1


class HostCopy(NamedTuple):
    """A copy of host data to another device: its source, its target device and whether it is asynchronous."""

    source: Tensor
    target: torch.device
    non_blocking: bool


def host_copy_of(func, args: tuple, kwargs: dict) -> Optional[HostCopy]:
    """What the dispatched op ``func(*args, **kwargs)`` copies from a CPU tensor to another device, if anything.

    Args:
        func: an ATen op overload (``aten._to_copy.default``, ``aten.copy_.default`` copy; others do not).
        args (tuple): its positional arguments.
        kwargs (dict): its keyword arguments.

    Returns:
        HostCopy | None: the copy, or None when the op copies nothing from the host to a device.
    """
    if func is torch.ops.aten._to_copy.default:
        source, target = args[0], kwargs.get('device')
        if source.device.type == 'cpu' and target is not None and torch.device(target).type != 'cpu':
            return HostCopy(source, torch.device(target), kwargs.get('non_blocking', False))
    elif func is torch.ops.aten.copy_.default:
        target, source = args[0], args[1]
        if source.device.type == 'cpu' and target.device.type != 'cpu':
            return HostCopy(source, target.device, args[2] if len(args) > 2 else kwargs.get('non_blocking', False))
    return None


class HostCopyCounter(TorchDispatchMode):
    """Record every blocking host-to-accelerator copy dispatched inside the mode.

    Use it inside a ``FakeTensorMode`` to check CUDA code without a GPU: a
    copy from a CPU tensor to a non-CPU device with ``non_blocking=False``
    (``torch.tensor(list, device='cuda')``, ``.to('cuda')``, ``copy_``) is
    what makes the host wait for the device.

    Attributes:
        copies (list[str]): one line per blocking copy: the op and the shape copied.
    """

    def __init__(self) -> None:
        super().__init__()
        self.copies: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        copy = host_copy_of(func, args, kwargs)
        if copy is not None and not copy.non_blocking:
            self.copies.append(f'{func}: {tuple(copy.source.shape)} -> {copy.target}')
        return func(*args, **kwargs)


#: ops whose CUDA kernels copy a result the host needs (a count, a scalar) back before they return
_SYNCING_OPS = frozenset([
    'aten::nonzero', 'aten::_local_scalar_dense', 'aten::is_nonzero', 'aten::masked_select', 'aten::_unique2',
    'aten::unique_dim', 'aten::unique_consecutive', 'aten::bincount', 'aten::equal'])
#: ops that sync on CUDA only when an index is a boolean mask (it is turned into integer indices by ``nonzero``)
_BOOL_INDEX_OPS = frozenset(['aten::index', 'aten::index_put', 'aten::index_put_', 'aten::_index_put_impl_'])


class SyncingOpRecorder(TorchDispatchMode):
    """Record every op dispatched inside the mode that synchronises with the host when it runs on CUDA.

    Such ops run silently on the CPU; on a GPU each one makes the host wait
    for the device. Recorded: ``nonzero``, ``.item()`` (``_local_scalar_dense``),
    ``masked_select``, ``unique``, ``bincount``, ``equal``, ``repeat_interleave``
    without ``output_size``, and indexing (or index assignment) with a boolean
    mask, on any device, outside :func:`permitted_host_sync` blocks (the
    backward of an op run inside such a block runs outside it).

    Args:
        device (str): the device type whose ops count (default ``'cpu'``: on a CPU run, every op; on a CUDA
            run pass ``'cuda'``, so that a read of a host tensor, which does not wait, is not recorded).

    Attributes:
        ops (list[str]): one line per recorded op: its name, ``[boolean index]`` where that is why, and where it
            ran: the innermost Python frame outside torch, or for an op of a backward the forward line that
            made its graph node (under ``torch.autograd.set_detect_anomaly``; else the backward call's).
    """

    def __init__(self, device: str = 'cpu') -> None:
        super().__init__()
        self.device_type = torch.device(device).type
        self.ops: List[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if getattr(_PERMITTED, 'depth', 0) or not any(
                isinstance(t, Tensor) and t.device.type == self.device_type for t in tree_flatten((args, kwargs))[0]):
            pass
        elif name in _SYNCING_OPS or (name == 'aten::repeat_interleave' and kwargs.get('output_size') is None
                                      and isinstance(args[0 if func._overloadname == 'Tensor' else 1], Tensor)):
            self.ops.append(f'{func} at {calling_site()}')
        elif name in _BOOL_INDEX_OPS and any(index is not None and index.dtype == torch.bool
                                             for index in args[1]):
            self.ops.append(f'{func} [boolean index] at {calling_site()}')
        return func(*args, **kwargs)


def calling_site(skip: Sequence[str] = ()) -> str:
    """``file:line`` of the code that ran the current op: the forward line of the autograd node being run (anomaly
    mode), else the innermost frame outside torch, this module and the files ``skip``."""
    node = torch._C._current_autograd_node()
    stack = node.metadata.get('traceback_') if node is not None else None
    if stack:
        frames = [line.strip() for line in ''.join(stack).splitlines() if line.strip().startswith('File ')]
        return f'{frames[-1]} (forward of {node.name()})' if frames else node.name()
    for frame in reversed(traceback.extract_stack()):
        if '/torch/' not in frame.filename and frame.filename != __file__ and frame.filename not in skip:
            return f'{frame.filename}:{frame.lineno}'
    return 'unknown'
