"""What ``tools/benchmark_model.py`` needs to compare two detectors fairly: smaller configs, shared weights,
timing of every part of a run.

* :func:`shrink_config` makes a config cheaper (point-cloud range, image size,
  queries) without changing its architecture.
* :func:`share_weights` copies every parameter and buffer the two models have
  in common (same name and shape) from one into the other, so that e.g. CMT
  and CMT-AQR differ only in AQR's own modules.
* :class:`PartTimer` times the forward of chosen modules (hooks) and chosen
  callables (wrappers): ``perf_counter`` on the CPU, CUDA events on the GPU;
  :func:`timed_parts` lists the parts of a CMT detector worth a row.
"""
import time
from collections import OrderedDict, defaultdict
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmcv import Config
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


def shrink_config(cfg: Config, half_range: Optional[float] = None, image_size: Optional[Sequence[int]] = None,
                  num_query: Optional[int] = None) -> Config:
    """``cfg`` (changed in place and returned) with a smaller point cloud range, image size or query count.

    Args:
        cfg (Config): a CMT detector config (``point_cloud_range``,
            ``ida_aug_conf``, ``model``).
        half_range (float, optional): the new range is ``[-r, r]`` in x and
            y (z unchanged); voxel sizes stay, so the voxel grid and BEV map
            shrink (``sparse_shape`` or the pillar scatter's ``output_shape``,
            ``grid_size``).
        image_size (Sequence[int], optional): ``(H, W)`` of the camera images
            (``ida_aug_conf['final_dim']``), multiples of 32.
        num_query (int, optional): the head's learned queries.

    Raises:
        ValueError: a range whose side is not a multiple of
            ``2 * out_size_factor`` voxels (the BEV map's stride, then
            SECOND's stride 2 undone by its FPN), or an image side that is not
            a multiple of 32.
    """
    model = cfg.model
    if half_range is not None:
        voxel = model.pts_voxel_layer.voxel_size[0]
        grid = int(round(2 * half_range / voxel))
        multiple = 2 * model.train_cfg.pts.out_size_factor
        if abs(grid * voxel - 2 * half_range) > 1e-6 or grid % multiple:
            raise ValueError(f'half range {half_range} m is {2 * half_range / voxel:g} voxels of {voxel} m across; '
                             f'it must be a whole multiple of {multiple} voxels')
        old = list(cfg.point_cloud_range)
        _replace_ranges(cfg._cfg_dict, [-half_range, -half_range, old[2], half_range, half_range, old[5]])
        encoder = model.pts_middle_encoder
        if 'sparse_shape' in encoder:  # spconv SparseEncoder
            encoder.sparse_shape = [encoder.sparse_shape[0], grid, grid]
        if 'output_shape' in encoder:  # pillars: PointPillarsScatter
            encoder.output_shape = [grid, grid]
        for mode_cfg in (model.train_cfg.pts, model.test_cfg.pts):
            mode_cfg.grid_size = [grid, grid, mode_cfg.grid_size[2]]
    if image_size is not None:
        if any(side % 32 for side in image_size):
            raise ValueError(f'image size {tuple(image_size)}: both sides must be multiples of 32')
        cfg.ida_aug_conf['final_dim'] = tuple(image_size)
    if num_query is not None:
        model.pts_bbox_head.num_query = num_query
    return cfg


def _replace_ranges(node: Union[dict, list], new_range: List[float]) -> None:
    """Set every ``point_cloud_range`` / ``pc_range`` under ``node`` to ``new_range``."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in list(items):
        if key in ('point_cloud_range', 'pc_range'):
            node[key] = list(new_range)
        elif isinstance(value, (dict, list)):
            _replace_ranges(value, new_range)


def build_detector(cfg: Config, seed: int) -> nn.Module:
    """The config's detector, built and initialised (``init_weights``) after ``torch.manual_seed(seed)``."""
    from mmdet3d.models import build_model

    torch.manual_seed(seed)
    model = build_model(cfg.model, train_cfg=cfg.get('train_cfg'), test_cfg=cfg.get('test_cfg'))
    model.init_weights()
    return model


def share_weights(source: nn.Module, target: nn.Module) -> List[str]:
    """Copy into ``target`` every parameter and buffer of ``source`` with the same name and shape.

    Returns:
        list[str]: the copied state-dict keys; ``target``'s other entries
        (e.g. CMT-AQR's ``aqr_weight_generator.*``) keep their values.
    """
    target_state, source_state = target.state_dict(), source.state_dict()
    shared = OrderedDict((name, value) for name, value in source_state.items()
                         if name in target_state and target_state[name].shape == value.shape)
    # the per-module versions: without them spconv 2's loader takes the weights for spconv 1's layout
    shared._metadata = source_state._metadata
    target.load_state_dict(shared, strict=False)
    return list(shared)


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
    if getattr(head, 'assigner', None) is not None:
        head.assigner.assign = timer.wrap(ASSIGNER_ROW, head.assigner.assign)
        rows.append(ASSIGNER_ROW)
    return rows
