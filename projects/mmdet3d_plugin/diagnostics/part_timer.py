"""Where a model run's time goes: :class:`PartTimer` times module forwards (hooks) and callables (wrappers).

``perf_counter`` on the CPU, CUDA events on the GPU; :func:`timed_parts`
lists the parts of a CMT detector worth a row and :func:`instrument` hooks
them all (``tools/benchmark_model.py``, ``tools/profile_train_step.py``)::

    timer = PartTimer(torch.device('cpu'))
    rows = instrument(model, timer)
    model.train_step(batch, None)
    timer.collect()        # {'img_backbone': ms, ..., 'loss (matching included)': ms, ...}
"""
import time
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

#: (row name, attribute path from the detector) of the modules timed with hooks, in data-flow order; nested
#: rows (indented) are part of their parent's time
MODULE_ROWS = (('img_backbone', 'img_backbone'), ('img_neck', 'img_neck'), ('pts_voxel_layer', 'pts_voxel_layer'),
               ('pts_voxel_encoder', 'pts_voxel_encoder'), ('pts_middle_encoder', 'pts_middle_encoder'),
               ('pts_backbone', 'pts_backbone'), ('pts_neck', 'pts_neck'), ('head', 'pts_bbox_head'),
               ('  AQR weight generator', 'pts_bbox_head.aqr_weight_generator'),
               ('  AQR bias generator', 'pts_bbox_head.attention_bias_generator'),
               ('  transformer', 'pts_bbox_head.transformer'))
LOSS_ROW = 'loss (matching included)'
ASSIGNER_ROW = '  assigner (Hungarian matching)'


class PartTimer:
    """Milliseconds per named part of a model run, summed until :meth:`collect`.

    Parts are module forwards (:meth:`hook`) and callables (:meth:`wrap`); a
    part called several times per run (a module run once per decoding pass,
    or again in a checkpointed backward) adds up. On the CPU each part is
    timed with ``time.perf_counter``; on CUDA with a pair of CUDA events,
    read in :meth:`collect` after a synchronisation, so that timing never
    waits for the device inside the run.

    Args:
        device (torch.device): where the model runs.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = torch.device(device).type == 'cuda'
        self._totals: Dict[str, float] = defaultdict(float)
        self._open: Dict[str, list] = defaultdict(list)
        self._pending: List[Tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def _now(self) -> Union[float, torch.cuda.Event]:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self, name: str) -> None:
        self._open[name].append(self._now())

    def stop(self, name: str) -> None:
        begin, end = self._open[name].pop(), self._now()
        if self.cuda:
            self._pending.append((name, begin, end))
        else:
            self._totals[name] += (end - begin) * 1e3

    def hook(self, name: str, module: nn.Module) -> None:
        """Time every forward of ``module`` as ``name``."""
        module.register_forward_pre_hook(lambda *_: self.start(name))
        module.register_forward_hook(lambda *_: self.stop(name))

    def wrap(self, name: str, function: Callable) -> Callable:
        """``function``, timed as ``name`` on every call."""

        def timed(*args, **kwargs):
            self.start(name)
            try:
                return function(*args, **kwargs)
            finally:
                self.stop(name)

        return timed

    def collect(self) -> Dict[str, float]:
        """Milliseconds per part since the last call (synchronises CUDA); starts a new sum."""
        if self._pending:
            torch.cuda.synchronize()
            for name, begin, end in self._pending:
                self._totals[name] += begin.elapsed_time(end)
        totals = dict(self._totals)
        self._totals.clear()
        self._pending.clear()
        return totals


def timed_parts(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(row name, module) of the parts of a CMT detector to time, in data-flow order.

    The rows of :data:`MODULE_ROWS` the model has, then, after the
    transformer, each attention of each decoder layer (``decoder layer i
    self_attn`` / ``cross_attn``, after the layer's ``operation_order``).
    """
    parts = []
    for name, path in MODULE_ROWS:
        try:
            module = model.get_submodule(path)
        except AttributeError:  # e.g. CMT has no AQR modules (they are None)
            continue
        parts.append((name, module))
        if path == 'pts_bbox_head.transformer':
            for index, layer in enumerate(module.decoder.layers):
                kinds = [op for op in layer.operation_order if op in ('self_attn', 'cross_attn')]
                parts += [(f'    decoder layer {index} {kind}', attention)
                          for kind, attention in zip(kinds, layer.attentions)]
    return parts


def instrument(model: nn.Module, timer: PartTimer) -> List[str]:
    """Hook :func:`timed_parts` and wrap the head's ``loss`` and its assigner's ``assign`` into ``timer``.

    Returns:
        list[str]: the row names, in data-flow order.
    """
    parts = timed_parts(model)
    for name, module in parts:
        timer.hook(name, module)
    rows = [name for name, _ in parts]
    head = model.pts_bbox_head
    head.loss = timer.wrap(LOSS_ROW, head.loss)
    rows.append(LOSS_ROW)
    assigner = find_assigner(head)
    if assigner is not None:
        assigner.assign = timer.wrap(ASSIGNER_ROW, assigner.assign)
        rows.append(ASSIGNER_ROW)
    return rows


def find_assigner(head: nn.Module) -> Optional[object]:
    """The head's box assigner (Hungarian matching): an ``assigner`` of the head or of one of its modules (its
    loss module); None without training config."""
    return next((module.assigner for module in head.modules() if getattr(module, 'assigner', None) is not None),
                None)
