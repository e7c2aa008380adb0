"""Device ops of a detector's head and optimizer step on fake CUDA (``tools/count_device_ops.py``).

The features come from the detector's own backbones on the CPU (the fixed
batch of ``tools/benchmark_model.py``); then, on fake CUDA tensors under
:class:`~..utils.device_ops.DeviceOpCounter`: the head's forward at inference
(``inference``) or in training with the ground truth (``train``: denoising
queries, dropout, the graph recorded for a backward that fake CUDA cannot run)
followed by one optimizer step (``foreach`` as PyTorch chooses on CUDA, unless
the config asks for ``fused``; after a first step, which also makes the
optimizer's state). The head's rows are the parts of the head
``tools/benchmark_model.py`` times (:func:`.part_timer.timed_parts`: the AQR
generators, the transformer, each decoder layer's self- and cross-attention).
"""
from typing import Dict, List, Sequence, Tuple

import torch
from mmcv import Config
from mmcv.runner import build_optimizer
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from ..utils.device_ops import DeviceOpCounter
from .model_benchmark import ModelBenchmarkOptions, build_pair, make_batch
from .part_timer import timed_parts

HEAD_ROW = 'head'
OPTIMIZER_ROW = 'optimizer step'
#: what :func:`count_model_ops` can count
MODES = ('inference', 'train')


def _head_parts(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """The rows :func:`.part_timer.timed_parts` gives the head and its parts (AQR generators, transformer, each
    decoder layer's attentions)."""
    parts = timed_parts(model)
    start = next(index for index, (row, _) in enumerate(parts) if row == HEAD_ROW)
    return parts[start:]


def count_model_ops(model: nn.Module, cfg: Config, batch: dict,
                    modes: Sequence[str] = MODES) -> Dict[str, Tuple[Dict[str, int], Dict[str, int]]]:
    """Per mode, the device ops and host-to-device copies per row (:data:`HEAD_ROW`'s parts; in ``train`` also
    :data:`OPTIMIZER_ROW`).

    The model is used up: its head is left on fake CUDA and its modules keep the counting hooks.
    """
    model.eval()
    with torch.no_grad():
        img_feats, pts_feats = model.extract_feat(batch['points'], batch['img'], batch['img_metas'])
    counters = {mode: DeviceOpCounter('cuda') for mode in modes}
    parts = _head_parts(model)
    for row, module in parts:
        for counter in counters.values():
            counter.hook(row, module)
    optimizer_cfg = dict(cfg.optimizer)
    if not optimizer_cfg.get('fused'):
        optimizer_cfg['foreach'] = True  # what PyTorch picks for CUDA parameters
    optimizer = build_optimizer(model, optimizer_cfg)
    rows = [row for row, _ in parts]
    with FakeTensorMode(allow_non_fake_inputs=True):
        head = model.pts_bbox_head.to('cuda')
        img_feats = [feat.to('cuda') for feat in img_feats]
        pts_feats = [feat.to('cuda') for feat in pts_feats]
        if 'inference' in counters:
            head.eval()
            with torch.no_grad(), counters['inference']:
                head(pts_feats, img_feats, batch['img_metas'])
        if 'train' in counters:
            head.train()
            gt_bboxes_3d = [boxes.to('cuda') for boxes in batch['gt_bboxes_3d']]
            gt_labels_3d = [labels.to('cuda') for labels in batch['gt_labels_3d']]
            features = [[feat.detach().requires_grad_() for feat in feats] for feats in (pts_feats, img_feats)]
            with counters['train']:
                head(*features, batch['img_metas'], gt_bboxes_3d, gt_labels_3d)
            _count_optimizer_step(optimizer, counters['train'])
    result = {}
    for mode, counter in counters.items():
        mode_rows = rows + ([OPTIMIZER_ROW] if mode == 'train' else [])
        result[mode] = ({row: counter.ops[row] for row in mode_rows},
                        {row: counter.host_copies[row] for row in mode_rows})
    return result


def _count_optimizer_step(optimizer: torch.optim.Optimizer, counter: DeviceOpCounter) -> None:
    """One step of ``optimizer``'s groups on fake CUDA parameters, counted as :data:`OPTIMIZER_ROW` (after an
    uncounted first step, which also makes the state: two zero-filled moments per parameter)."""
    for group in optimizer.param_groups:
        group['params'] = [torch.zeros_like(param, device='cuda').requires_grad_() for param in group['params']]
        for param in group['params']:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    with counter, counter.part(OPTIMIZER_ROW):
        optimizer.step()


def count_pair(paths: Sequence[str], options: ModelBenchmarkOptions, modes: Sequence[str] = MODES) -> dict:
    """Both configs' counts on the same batch, per mode: ``{mode: {'rows': [...], 'A': (ops, copies), 'B': ...}}``."""
    models, cfgs, _ = build_pair(tuple(paths), options)
    batch = make_batch(cfgs[1], options)
    counts = [count_model_ops(model, cfg, batch, modes) for model, cfg in zip(models, cfgs)]
    result = {}
    for mode in modes:
        ops_a, ops_b = counts[0][mode][0], counts[1][mode][0]
        rows = list(ops_b) + [row for row in ops_a if row not in ops_b]  # B's rows first (AQR's)
        result[mode] = dict(rows=rows, A=counts[0][mode], B=counts[1][mode])
    return result


def count_table(result: dict, names: Sequence[str] = ('A', 'B')) -> str:
    """Markdown table of one mode of :func:`count_pair`'s result: device ops (and host copies) per row, A and B."""
    lines = [f'| part | {names[0]} device ops | {names[1]} device ops | {names[0]} / {names[1]} host copies |',
             '|---|---:|---:|---:|']
    for row in result['rows']:
        cells = []
        for side in ('A', 'B'):
            ops = result[side][0].get(row)
            cells.append('—' if ops is None else str(ops))
        copies = ' / '.join('—' if result[side][1].get(row) is None else str(result[side][1][row]) for side in 'AB')
        lines.append(f'| {row} | {cells[0]} | {cells[1]} | {copies} |')
    return '\n'.join(lines)
