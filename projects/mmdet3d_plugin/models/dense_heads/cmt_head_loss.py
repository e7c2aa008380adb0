"""The losses of CMT's head: Hungarian-matched focal + L1 losses and the denoising losses.

For every decoder layer and every task head:

* **matching loss**: each sample's queries are matched one-to-one to the task's ground-truth boxes
  (``HungarianAssigner3D``); the focal classification loss covers all queries (unmatched ones are background)
  and is averaged over ``max(num_pos + 0.1 * num_neg, 1)``; the L1 loss compares the matched queries' 10-value
  codes with :func:`normalize_bbox` of their boxes, weighted by ``train_cfg['code_weights']`` and averaged over
  ``num_pos``; with ``train_cfg['heading_axis_weight'] > 0`` it also compares the box axis,
  :func:`heading_axis` of the predicted and true ``(sin, cos)`` (see there).
* **DN loss** (training with denoising queries): each DN query is compared with the box it was made from, the
  classification averaged over ``M * pi / 6 * split^3`` (the expected number of positive copies, as in upstream
  CMT) and the L1 loss over the number of DN targets (averaged over GPUs). A batch without any ground-truth box
  has no DN queries: its DN losses are zeros attached to the graph, so the set of logged losses never changes.

:class:`DetectionLoss` (built from the head's ``loss_cls``, ``loss_bbox``, ``train_cfg`` and ``denoising``
options) takes the ground truth (per sample ``gt_bboxes_3d`` with velocity and ``gt_labels_3d [n]``) and the
head's :class:`HeadOutputs` (per task ``[L, bs, Q, .]`` predictions, ``dn_`` ones ``[L, bs, pad, .]``) and
returns scalar losses: ``loss_cls`` / ``loss_bbox`` (last layer), ``d{i}.loss_cls`` / ``d{i}.loss_bbox``
(layer ``i``), and the same with ``dn_`` when DN training is on.

With per-modality decoding passes (``pass_plan.py``) every pass gets these losses, its own matching included;
a single-modality pass's keys are prefixed with its name (``lidar.loss_cls``, ``lidar.d0.dn_loss_bbox``, ...),
and ``<pass>.num_samples`` logs how many samples it trained on: samples whose input for the pass was dropped
have no target and weight 0, and the averages count only the other samples.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmdet.core import build_assigner, reduce_mean
from mmdet.models.builder import build_loss
from torch import Tensor, nn

from ...core.bbox.util import AXIS_EPS, heading_axis, normalize_bbox
from ...utils.host_data import device_constant, host_to_device
from ..utils.denoising import DenoisingConfig, DenoisingQueries
from .head_outputs import HeadOutputs
from .pass_plan import MODALITY_PASSES

REGRESSION_KEYS = ('center', 'height', 'dim', 'rot', 'vel')


def gravity_center_boxes(boxes) -> Tensor:
    """``[n, 9]`` ``(x, y, z, w, l, h, yaw, vx, vy)`` with ``(x, y, z)`` the gravity centre of mmdet3d boxes."""
    if boxes.tensor.size(-1) != 9:
        raise ValueError(f'CMT regresses velocity: gt boxes need 9 values (x, y, z, w, l, h, yaw, vx, vy), got '
                         f'{boxes.tensor.size(-1)} (load the annotations with velocity)')
    return torch.cat((boxes.gravity_center, boxes.tensor[:, 3:]), dim=1)


def regression_code(preds: Dict[str, Tensor], prefix: str = '') -> Tensor:
    """``[L, bs, Q, 10]``: the regression branches concatenated in CMT's code order."""
    return torch.cat([preds[prefix + key] for key in REGRESSION_KEYS], dim=-1)


def task_labels(labels: Tensor, offset: int, num_task_classes: int) -> Tensor:
    """Global class indices -> the task's own indices; classes of other tasks (and background) -> ``num_task_classes``."""
    local = labels - offset
    outside = (local < 0) | (local >= num_task_classes)
    return torch.where(outside, torch.full_like(local, num_task_classes), local)


def rows_where(condition: Tensor) -> Tensor:
    """``[n]`` long indices of the ``True`` entries of a ``[N]`` bool tensor.

    The loss selects rows of differentiable tensors with these indices
    (``index_select``) rather than with the bool mask itself: indexing with a
    bool mask runs ``nonzero`` again in its backward, where the host would
    wait for the device outside the loss's ``permitted_host_sync`` region.
    """
    return condition.nonzero()[:, 0]


def sample_objects(assigned: Tensor, object_index: Tensor) -> Tensor:
    """Map a task's matching ``[Q]`` (task-local box index, ``-1``: none) to the sample's box indices."""
    if object_index.numel() == 0:  # the task has no object in the sample: nothing is matched
        return assigned
    return torch.where(assigned >= 0, object_index[assigned.clamp(min=0)], assigned)


class DetectionLoss(nn.Module):
    """CMT's matching and DN losses of every decoding pass (see the module docstring).

    An ``nn.Module`` without parameters or buffers (it adds no state-dict key).

    Args:
        num_classes (Sequence[int]): classes of each task (global classes in task order).
        loss_cls (dict): classification loss config (sigmoid focal loss).
        loss_bbox (dict): regression loss config (L1).
        train_cfg (dict, optional): ``assigner``, ``code_weights`` (10 values) and optionally
            ``heading_axis_weight`` (default 0: upstream CMT's loss); None: no losses.
        denoising (DenoisingConfig): the DN options (``scalar > 0``: DN losses; ``split``, ``dn_weight``).
        head_name (str): for the error messages.
    """

    def __init__(self, num_classes: Sequence[int], loss_cls: dict, loss_bbox: dict, train_cfg: Optional[dict],
                 denoising: DenoisingConfig, head_name: str = 'CmtHead') -> None:
        super().__init__()
        self.num_classes, self.train_cfg, self.head_name = list(num_classes), train_cfg, head_name
        self.scalar, self.split, self.dn_weight = denoising.scalar, denoising.split, denoising.dn_weight
        self.loss_cls = build_loss(loss_cls)
        self.loss_bbox = build_loss(loss_bbox)
        self.assigner = build_assigner(train_cfg['assigner']) if train_cfg else None

    def gt_boxes_and_labels(self, gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor], device: torch.device,
                            check_classes: bool = True) -> Tuple[List[Tensor], List[Tensor]]:
        """Per sample gravity-centre boxes ``[n, 9]`` and long labels ``[n]``, on ``device``.

        ``check_classes``: raise unless every label is one of the head's
        classes. Reading the labels makes the host wait for the device, so
        ``forward`` (whose DN queries use the labels as targets only) leaves
        the check to ``loss``, which runs where the host waits anyway (the
        Hungarian matching, ``permitted_host_sync``).
        """
        if len(gt_bboxes_3d) != len(gt_labels_3d):
            raise ValueError(f'{len(gt_bboxes_3d)} box sets but {len(gt_labels_3d)} label sets')
        boxes, labels = [], []
        total = sum(self.num_classes)
        for index, (sample_boxes, sample_labels) in enumerate(zip(gt_bboxes_3d, gt_labels_3d)):
            sample_labels = sample_labels.long()
            if sample_labels.numel() != len(sample_boxes):
                raise ValueError(f'sample {index}: {len(sample_boxes)} boxes but {sample_labels.numel()} labels')
            if check_classes and sample_labels.numel() and (sample_labels.min() < 0 or sample_labels.max() >= total):
                raise ValueError(f'sample {index}: labels must be in [0, {total}), got {sample_labels.tolist()}')
            boxes.append(gravity_center_boxes(sample_boxes).to(device))
            labels.append(sample_labels.to(device))
        return boxes, labels

    def _class_offsets(self) -> List[int]:
        offsets, start = [], 0
        for count in self.num_classes:
            offsets.append(start)
            start += count
        return offsets

    @property
    def heading_axis_weight(self) -> float:
        return float((self.train_cfg or {}).get('heading_axis_weight', 0.0))

    def _code_weights(self, like: Tensor) -> Tensor:
        if not self.train_cfg or 'code_weights' not in self.train_cfg:
            raise KeyError(f"{self.head_name}.loss needs train_cfg['code_weights'] (10 values)")
        return device_constant(self.train_cfg['code_weights'], like.device, like.dtype)

    def forward(self, gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor], outputs: HeadOutputs,
                matched_objects: Optional[List[List[Tensor]]] = None) -> Dict[str, Tensor]:
        """Matching and DN losses of every decoder layer of every decoding pass.

        Args:
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample, with velocity.
            gt_labels_3d (Sequence[Tensor]): per sample global class indices.
            outputs (HeadOutputs): the head's ``forward`` in training mode (fp32).
            matched_objects (list, optional): an empty list to fill with the
                fused pass's last-layer matching: per sample, one ``[Q]`` long
                tensor per task holding the index (in the sample's
                ``gt_bboxes_3d``) of the object each query is matched to, ``-1``
                where none.

        Returns:
            dict[str, Tensor]: scalar losses (see the module docstring).
        """
        if self.assigner is None:
            raise RuntimeError(f'{self.head_name} was built without train_cfg; it cannot compute losses')
        boxes, labels = self.gt_boxes_and_labels(gt_bboxes_3d, gt_labels_3d, outputs[0][0]['cls_logits'].device)
        task_gts, task_gt_index = [], []
        for offset, num_cls in zip(self._class_offsets(), self.num_classes):
            per_sample, per_sample_index = [], []
            for sample_boxes, sample_labels in zip(boxes, labels):
                local = task_labels(sample_labels, offset, num_cls)
                keep = local < num_cls
                per_sample.append((sample_boxes[keep], local[keep]))
                per_sample_index.append(keep.nonzero()[:, 0])
            task_gts.append(per_sample)
            task_gt_index.append(per_sample_index)
        losses: Dict[str, Tensor] = {}
        for name, pass_preds, trained in outputs.decoding_passes():
            prefix = MODALITY_PASSES[name].loss_prefix
            assignments = [] if matched_objects is not None and prefix == '' else None
            losses.update(self._pass_losses(pass_preds, outputs.dn_queries, trained, task_gts, [len(b) for b in boxes],
                                            prefix, assignments))
            if assignments is not None:
                matched_objects.extend(
                    [sample_objects(task[sample], task_gt_index[task_id][sample])
                     for task_id, task in enumerate(assignments)] for sample in range(len(boxes)))
        return losses

    def _pass_losses(self, preds_dicts: Sequence[List[dict]], dn_queries: Optional[DenoisingQueries],
                     trained: Optional[Sequence[bool]], task_gts: Sequence[Sequence[Tuple[Tensor, Tensor]]],
                     num_boxes: Sequence[int], prefix: str,
                     assignments: Optional[List[List[Tensor]]] = None) -> Dict[str, Tensor]:
        """The losses of one decoding pass, named with ``prefix``.

        Args:
            preds_dicts: the pass's per task predictions.
            dn_queries (DenoisingQueries, optional): the batch's DN queries.
            trained (Sequence[bool], optional): per sample whether it takes
                part (a single-modality pass, whose ``num_samples`` is logged);
                None: every sample (the fused pass).
            task_gts: per task, per sample ``(boxes [n, 9], task labels [n])``.
            num_boxes (Sequence[int]): ground-truth boxes per sample.
            prefix (str): ``''`` for the fused pass, ``'<pass>.'`` otherwise.
            assignments (list, optional): filled with the last layer's
                matching: per task, per sample ``[Q]`` long, the matched
                object's index among the task's objects, ``-1`` where none.
        """
        logged_samples = trained is not None
        trained = tuple(trained) if logged_samples else (True, ) * len(num_boxes)
        num_layers = preds_dicts[0][0]['cls_logits'].size(0)
        losses: Dict[str, Tensor] = {}
        matching = [self._layer_matching_loss(preds_dicts, task_gts, layer, trained,
                                              assignments if layer == num_layers - 1 else None)
                    for layer in range(num_layers)]
        self._name_layer_losses(losses, matching, prefix, '')
        if logged_samples:
            losses[f'{prefix}num_samples'] = torch.full((), float(sum(trained)), device=matching[-1][0].device)
        if self.scalar > 0:
            num_targets, target_weights = 0, None
            if dn_queries is not None:
                num_targets = dn_queries.groups * sum(n for n, keep in zip(num_boxes, trained) if keep)
                if not all(trained):
                    target_weights = host_to_device(trained, dn_queries.batch_index.device,
                                                    torch.float32)[dn_queries.batch_index]
            # every rank calls reduce_mean exactly once per pass, with or without DN queries
            bbox_avg_factor = torch.clamp(reduce_mean(matching[-1][0].new_tensor([num_targets])), min=1).item()
            dn = [self._layer_dn_loss(preds_dicts, dn_queries, layer, num_targets, bbox_avg_factor, target_weights)
                  for layer in range(num_layers)]
            self._name_layer_losses(losses, dn, prefix, 'dn_')
        return losses

    @staticmethod
    def _name_layer_losses(losses: Dict[str, Tensor], per_layer: Sequence[Tuple[Tensor, Tensor]], pass_prefix: str,
                           loss_prefix: str) -> None:
        losses[f'{pass_prefix}{loss_prefix}loss_cls'], losses[f'{pass_prefix}{loss_prefix}loss_bbox'] = per_layer[-1]
        for layer, (loss_cls, loss_bbox) in enumerate(per_layer[:-1]):
            losses[f'{pass_prefix}d{layer}.{loss_prefix}loss_cls'] = loss_cls
            losses[f'{pass_prefix}d{layer}.{loss_prefix}loss_bbox'] = loss_bbox

    def _layer_matching_loss(self, preds_dicts, task_gts, layer: int, trained: Sequence[bool],
                             assignments: Optional[List[List[Tensor]]] = None) -> Tuple[Tensor, Tensor]:
        loss_cls, loss_bbox = 0, 0
        for task_id, task_preds in enumerate(preds_dicts):
            preds = task_preds[0]
            task_assignments = None
            if assignments is not None:
                task_assignments = []
                assignments.append(task_assignments)
            task_cls, task_bbox = self._matching_loss(
                regression_code(preds)[layer], preds['cls_logits'][layer], task_gts[task_id], trained,
                task_assignments)
            loss_cls, loss_bbox = loss_cls + task_cls, loss_bbox + task_bbox
        return loss_cls, loss_bbox

    def _matching_loss(self, codes: Tensor, logits: Tensor, gts: Sequence[Tuple[Tensor, Tensor]],
                       trained: Sequence[bool], assignments: Optional[List[Tensor]] = None) -> Tuple[Tensor, Tensor]:
        """One task, one decoder layer.

        Args:
            codes (Tensor): ``[bs, Q, 10]`` predicted codes.
            logits (Tensor): ``[bs, Q, C_t]``.
            gts: per sample ``(boxes [n, 9], task labels [n])``.
            trained (Sequence[bool]): per sample whether it takes part; the
                others are not matched and weigh 0.
            assignments (list, optional): filled with per sample ``[Q]`` long,
                the matched box's index in ``gts``, ``-1`` where none.
        """
        num_task_classes = logits.size(-1)
        cls_targets, cls_weights, pos_preds, pos_targets = [], [], [], []
        for sample_codes, sample_logits, (gt_boxes, gt_labels), keep in zip(codes, logits, gts, trained):
            if keep:
                assigned = self.assigner.assign(sample_codes, sample_logits, gt_boxes, gt_labels).gt_inds
            else:
                assigned = torch.zeros(sample_codes.size(0), dtype=torch.long, device=sample_codes.device)
            positive = rows_where(assigned > 0)
            matched = assigned[positive] - 1
            if assignments is not None:
                assignments.append(assigned - 1)
            targets = torch.full_like(assigned, num_task_classes)
            targets[positive] = gt_labels[matched]
            cls_targets.append(targets)
            cls_weights.append(torch.full_like(targets, float(keep), dtype=logits.dtype))
            pos_preds.append(sample_codes.index_select(0, positive))
            pos_targets.append(gt_boxes[matched])
        cls_targets = torch.cat(cls_targets)
        num_pos = sum(len(p) for p in pos_preds)
        num_neg = sum(trained) * logits.size(1) - num_pos
        loss_cls = self.loss_cls(logits.flatten(0, 1), cls_targets, torch.cat(cls_weights),
                                 avg_factor=max(num_pos + 0.1 * num_neg, 1.0))
        loss_bbox = self._code_l1_loss(torch.cat(pos_preds), torch.cat(pos_targets), avg_factor=num_pos)
        return torch.nan_to_num(loss_cls), torch.nan_to_num(loss_bbox)

    def _code_l1_loss(self, pred_codes: Tensor, gt_boxes: Tensor, avg_factor: float,
                      target_weights: Optional[Tensor] = None) -> Tensor:
        """L1 between ``[n, 10]`` predicted codes and the codes of ``[n, 9]`` boxes, non-finite targets skipped,
        plus the heading-axis term when ``heading_axis_weight > 0``.

        ``target_weights`` (``[n]``, optional) scales each box's code weights.
        """
        target = normalize_bbox(gt_boxes)
        finite = rows_where(torch.isfinite(target).all(dim=-1))
        pred_codes, target = pred_codes.index_select(0, finite), target[finite]
        box_weights = torch.ones_like(target[:, 0]) if target_weights is None else target_weights[finite]
        weights = self._code_weights(pred_codes).expand_as(pred_codes) * box_weights[:, None]
        loss = self.loss_bbox(pred_codes, target, weights, avg_factor=avg_factor)
        if self.heading_axis_weight > 0:
            axis_weights = (self.heading_axis_weight * box_weights)[:, None].expand(-1, 2)
            loss = loss + self.loss_bbox(heading_axis(pred_codes[:, 6:8], AXIS_EPS), heading_axis(target[:, 6:8]),
                                         axis_weights, avg_factor=avg_factor)
        return loss

    def _layer_dn_loss(self, preds_dicts, dn_queries: Optional[DenoisingQueries], layer: int, num_targets: int,
                       bbox_avg_factor: float, target_weights: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        loss_cls, loss_bbox = 0, 0
        for offset, task_preds in zip(self._class_offsets(), preds_dicts):
            preds = task_preds[0]
            if dn_queries is None:
                zero = preds['cls_logits'][layer].sum() * 0
                task_cls, task_bbox = zero, zero
            else:
                task_cls, task_bbox = self._dn_loss(regression_code(preds, 'dn_')[layer], preds['dn_cls_logits'][layer],
                                                    dn_queries, offset, num_targets, bbox_avg_factor, target_weights)
            loss_cls, loss_bbox = loss_cls + task_cls, loss_bbox + task_bbox
        return loss_cls, loss_bbox

    def _dn_loss(self, codes: Tensor, logits: Tensor, dn_queries: DenoisingQueries, offset: int, num_targets: int,
                 bbox_avg_factor: float, target_weights: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """One task, one decoder layer of DN queries.

        Args:
            codes (Tensor): ``[bs, pad, 10]``.
            logits (Tensor): ``[bs, pad, C_t]``.
            dn_queries (DenoisingQueries): the batch's DN queries and targets.
            offset (int): the task's first global class.
            num_targets (int): DN targets that take part (the classification average).
            bbox_avg_factor (float): the regression average.
            target_weights (Tensor, optional): ``[M]`` weight of each DN
                target (None: all 1).
        """
        num_task_classes = logits.size(-1)
        index = (dn_queries.batch_index, dn_queries.query_index)
        codes, logits = codes[index], logits[index]
        cls_targets = task_labels(dn_queries.labels, offset, num_task_classes)
        avg_factor = max(num_targets * math.pi / 6 * self.split ** 3, 1.0)
        cls_weights = torch.ones_like(cls_targets, dtype=logits.dtype) if target_weights is None \
            else target_weights.to(logits.dtype)
        loss_cls = self.loss_cls(logits, cls_targets, cls_weights, avg_factor=avg_factor)
        in_task = rows_where(task_labels(dn_queries.gt_labels, offset, num_task_classes) < num_task_classes)
        if in_task.numel():
            loss_bbox = self._code_l1_loss(codes.index_select(0, in_task), dn_queries.gt_bboxes[in_task],
                                           avg_factor=bbox_avg_factor,
                                           target_weights=None if target_weights is None else target_weights[in_task])
        else:
            loss_bbox = codes.sum() * 0
        return (self.dn_weight * torch.nan_to_num(loss_cls), self.dn_weight * torch.nan_to_num(loss_bbox))
