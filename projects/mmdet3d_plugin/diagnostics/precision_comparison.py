"""How far a detector's outputs move when its cross-attention runs in half precision instead of float32
(``tools/compare_attention_precision.py``).

One detector (a config's random weights from a seed, or a checkpoint) and one seeded synthetic batch
(:mod:`.synthetic_batch`); ``simple_test`` runs in float32 cross-attention, again in float32 (the run-to-run
floor of the device), then once per half dtype (:func:`set_attention_dtype`: only the attention between the
float32 projections changes). Compared with the first float32 run, on the last decoder layer:

* ``score``: the largest change of any class score (sigmoid) of any query;
* on the detections (float32's ``max_num`` best ``(query, class)`` pairs, the boxes the coder decodes before
  its score and range filters, matched by query and class): ``centre_m`` (3-D distance, metres), ``size``
  (``|log|`` of the size ratio), ``heading_rad`` (wrapped), ``velocity`` (m/s), each the largest over them;
* ``shared_top``: the share of float32's ``max_num`` best pairs that the other run ranks among its own
  ``max_num`` best (informative, not judged: scores that nearly tie may swap places in any precision).

A half run passes when each of the five maxima is within :data:`TOLERANCES` of its dtype.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmcv.runner import load_checkpoint
from torch import Tensor, nn

from ..core.bbox.coders.multi_task_bbox_coder import MultiTaskBBoxCoder, pair_rows
from ..core.bbox.util import denormalize_bbox
from ..models.dense_heads.head_outputs import fp32_predictions
from ..models.utils.petr_attention import set_attention_dtype
from .model_benchmark import ModelBenchmarkOptions, build_detector, load_config, make_batch

#: compared quantities, in table order
METRICS = ('score', 'centre_m', 'size', 'heading_rad', 'velocity')
#: per half dtype, the largest change of each metric a run may show (bfloat16 keeps 3 fewer mantissa bits)
TOLERANCES: Dict[str, Dict[str, float]] = {
    'float16': dict(score=0.01, centre_m=0.05, size=0.01, heading_rad=0.02, velocity=0.05),
    'bfloat16': dict(score=0.08, centre_m=0.4, size=0.08, heading_rad=0.16, velocity=0.4),
}
FLOOR_RUN = 'float32 again'


@dataclass(frozen=True)
class LastLayerPredictions:
    """The last decoder layer's predictions of every task, in the coder's layout
    (:meth:`MultiTaskBBoxCoder.last_layer`).

    Attributes:
        scores (Tensor): ``[bs, Q, C]`` sigmoid class scores, the tasks' classes concatenated.
        boxes (Tensor): ``[bs, T * Q, 9]`` the boxes ``(x, y, z, w, l, h, yaw, vx, vy)``, task ``t``'s at rows
            ``t * Q ... (t + 1) * Q - 1``.
        class_to_task (Tensor): ``[C]`` the task of each class.
    """

    scores: Tensor
    boxes: Tensor
    class_to_task: Tensor


def last_layer_predictions(coder: MultiTaskBBoxCoder, tasks: Sequence[List[Dict[str, Tensor]]]) -> LastLayerPredictions:
    """:class:`LastLayerPredictions` of a head's output (``HeadOutputs`` or per task ``[dict]``), in float32."""
    logits, codes, class_to_task = coder.last_layer(fp32_predictions(tasks))
    return LastLayerPredictions(logits.sigmoid(), denormalize_bbox(codes), class_to_task)


def detection_boxes(predictions: LastLayerPredictions, pairs: Tensor) -> Tensor:
    """``[bs, k, 9]`` the boxes of ``pairs`` ``[bs, k]`` (flat ``query * C + class`` indices)."""
    _, num_query, num_classes = predictions.scores.shape
    _, _, rows = pair_rows(pairs, num_classes, num_query, predictions.class_to_task)
    return predictions.boxes.gather(1, rows[..., None].expand(-1, -1, predictions.boxes.size(-1)))


def compare_predictions(reference: LastLayerPredictions, other: LastLayerPredictions, max_num: int) -> Dict[str, float]:
    """The :data:`METRICS` maxima and ``shared_top`` of ``other`` against ``reference`` (see the module doc)."""
    if reference.scores.shape != other.scores.shape or reference.boxes.shape != other.boxes.shape:
        raise ValueError(f'predictions of different shapes: scores {tuple(reference.scores.shape)} vs '
                         f'{tuple(other.scores.shape)}, boxes {tuple(reference.boxes.shape)} vs '
                         f'{tuple(other.boxes.shape)}')
    flat_reference, flat_other = reference.scores.flatten(1), other.scores.flatten(1)
    count = min(max_num, flat_reference.size(1))
    top_reference, top_other = flat_reference.topk(count).indices, flat_other.topk(count).indices
    shared = torch.stack([torch.isin(a, b).float().mean() for a, b in zip(top_reference, top_other)]).mean()
    boxes_a, boxes_b = detection_boxes(reference, top_reference), detection_boxes(other, top_reference)
    heading = torch.remainder(boxes_a[..., 6] - boxes_b[..., 6] + torch.pi, 2 * torch.pi) - torch.pi
    values = dict(score=(flat_reference - flat_other).abs().max(),
                  centre_m=(boxes_a[..., :3] - boxes_b[..., :3]).norm(dim=-1).max(),
                  size=(boxes_a[..., 3:6].log() - boxes_b[..., 3:6].log()).abs().max(),
                  heading_rad=heading.abs().max(),
                  velocity=(boxes_a[..., 7:9] - boxes_b[..., 7:9]).norm(dim=-1).max(),
                  shared_top=shared)
    return {name: float(value) for name, value in values.items()}


def exceeded(metrics: Dict[str, float], dtype: str) -> List[str]:
    """The metrics of a ``dtype`` run beyond their tolerance, as ``'score 0.02 > 0.01'``."""
    limits = TOLERANCES[dtype]
    return [f'{name} {metrics[name]:.3g} > {limits[name]:g}' for name in METRICS
            if not metrics[name] <= limits[name]]  # NaN exceeds


def head_predictions(model: nn.Module, batch: dict) -> LastLayerPredictions:
    """``model.simple_test`` on ``batch`` without gradients; its head's last-layer predictions."""
    captured = []
    handle = model.pts_bbox_head.register_forward_hook(lambda module, inputs, output: captured.append(output))
    try:
        with torch.no_grad():
            model.simple_test(batch['points'], batch['img_metas'], batch['img'])
    finally:
        handle.remove()
    if len(captured) != 1:
        raise RuntimeError(f'expected one head call in simple_test, saw {len(captured)}')
    return last_layer_predictions(model.pts_bbox_head.bbox_coder, captured[0])


def compare_config(config: str, dtypes: Sequence[str], options: ModelBenchmarkOptions,
                   checkpoint: Optional[str] = None) -> List[dict]:
    """One row per run after the first float32 one (:data:`FLOOR_RUN`, then each of ``dtypes``).

    Args:
        config (str): a detector config (path relative to the repository root or not).
        dtypes (Sequence[str]): keys of :data:`TOLERANCES`.
        options (ModelBenchmarkOptions): device, seed, batch size, shapes (``tiny`` and the rest), cfg options.
        checkpoint (str, optional): weights to load, every tensor of the model (mmcv's strict loading); default:
            the config's initialisation after ``seed``.

    Returns:
        list[dict]: ``config``, ``weights``, ``run``, the metrics, ``failures`` (:func:`exceeded`; empty for the
        floor) and ``attention`` (the cross-attention's dtype in that run).
    """
    unknown = sorted(set(dtypes) - set(TOLERANCES))
    if unknown:
        raise ValueError(f'no tolerance for {unknown}; compare one of {sorted(TOLERANCES)} with float32')
    options = options.resolved()
    cfg = load_config(config, options)
    model = build_detector(cfg, options.seed)
    weights = f'random (seed {options.seed})'
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu', strict=True, logger='silent')
        weights = checkpoint
    model = model.to(options.device).eval()
    batch = make_batch(cfg, options)
    max_num = model.pts_bbox_head.bbox_coder.max_num
    runs: List[Tuple[str, str]] = [('float32', 'float32'), (FLOOR_RUN, 'float32')] + [(d, d) for d in dtypes]
    predictions = {}
    for run, dtype in runs:
        set_attention_dtype(model, dtype)
        predictions[run] = head_predictions(model, batch)
    rows = []
    for run, dtype in runs[1:]:
        metrics = compare_predictions(predictions['float32'], predictions[run], max_num)
        rows.append(dict(config=config, weights=weights, run=run, attention=dtype, max_num=max_num, **metrics,
                         failures=[] if run == FLOOR_RUN else exceeded(metrics, dtype)))
    return rows


def markdown_table(rows: Sequence[dict]) -> str:
    """The rows of :func:`compare_config` as a Markdown table, the tolerances under it."""
    lines = ['| config | weights | run | max abs score | centre (m) | size (abs log) | heading (rad) | velocity (m/s) '
             '| shared top | result |', '|---|---|---|---|---|---|---|---|---|---|']
    for row in rows:
        result = 'floor' if row['run'] == FLOOR_RUN else ('ok' if not row['failures'] else
                                                          'FAILED: ' + '; '.join(row['failures']))
        values = ' | '.join(f'{row[name]:.2e}' for name in METRICS)
        lines.append(f'| {row["config"]} | {row["weights"]} | {row["run"]} | {values} | '
                     f'{row["shared_top"]:.3f} of {row["max_num"]} | {result} |')
    tolerances = '; '.join(f'{dtype} ' + ', '.join(f'{name} {limits[name]:g}' for name in METRICS)
                           for dtype, limits in TOLERANCES.items())
    return '\n'.join(lines + ['', f'tolerances: {tolerances}'])

