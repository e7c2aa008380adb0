"""One-to-one matching of CMT's queries to ground-truth boxes."""
from typing import Optional, Sequence

import torch
from mmdet.core.bbox.assigners import AssignResult, BaseAssigner
from mmdet.core.bbox.builder import BBOX_ASSIGNERS
from mmdet.core.bbox.match_costs import build_match_cost
from scipy.optimize import linear_sum_assignment

from ....utils.host_data import device_constant, host_to_device
from ..util import normalize_bbox

_CODE_SIZE_NO_VELOCITY = 8


@BBOX_ASSIGNERS.register_module()
class HungarianAssigner3D(BaseAssigner):
    """Hungarian matching between box predictions and ground truth.

    The cost of pairing query ``i`` with ground truth ``j`` is
    ``cls_cost(cls_pred[i], gt_labels[j]) + reg_cost(code_i, normalize_bbox(gt_j))``,
    the regression cost taken over the first 8 code values (centre, sizes,
    yaw) or all 10 with ``with_velo=True``. Both codes are multiplied by
    ``code_weights`` first, when given. Matched queries get the (1-based)
    index of their ground truth, all others 0 (background); with no ground
    truth every query is background.

    Args:
        cls_cost (dict): match cost config on ``(cls_pred, gt_labels)``,
            e.g. ``dict(type='FocalLossCost', weight=2.0)``.
        reg_cost (dict): match cost config on box codes,
            e.g. ``dict(type='BBox3DL1Cost', weight=0.25)``.
        iou_cost (dict): kept for config compatibility with CMT/DETR3D
            (``dict(type='IoUCost', weight=0.0)``). CMT's matching uses no IoU
            term, so its weight must be 0; another value raises ``ValueError``
            instead of being ignored.
        pc_range (Sequence[float], optional): point-cloud range, passed to
            :func:`normalize_bbox`.
        code_weights (Sequence[float], optional): per-code-value weights
            (10 values for the CMT code).
    """

    def __init__(self,
                 cls_cost: dict = dict(type='ClassificationCost', weight=1.0),
                 reg_cost: dict = dict(type='BBox3DL1Cost', weight=1.0),
                 iou_cost: dict = dict(type='IoUCost', weight=0.0),
                 pc_range: Optional[Sequence[float]] = None,
                 code_weights: Optional[Sequence[float]] = None) -> None:
        self.cls_cost = build_match_cost(cls_cost)
        self.reg_cost = build_match_cost(reg_cost)
        self.iou_cost = build_match_cost(iou_cost)
        if getattr(self.iou_cost, 'weight', 0.0) != 0:
            raise ValueError(f'HungarianAssigner3D matches with classification and L1 costs only; iou_cost must '
                             f'have weight 0, got {iou_cost}')
        self.pc_range = pc_range
        self.code_weights = None if code_weights is None else [float(w) for w in code_weights]

    def assign(self,
               bbox_pred: torch.Tensor,
               cls_pred: torch.Tensor,
               gt_bboxes: torch.Tensor,
               gt_labels: torch.Tensor,
               gt_bboxes_ignore: Optional[torch.Tensor] = None,
               code_weights: Optional[Sequence[float]] = None,
               with_velo: bool = False) -> AssignResult:
        """Assign each query to a ground-truth box or to background.

        Args:
            bbox_pred (Tensor): ``[num_query, 10]`` (or ``[num_query, 8]``)
                predicted box codes in the :func:`normalize_bbox` encoding.
            cls_pred (Tensor): ``[num_query, num_classes]`` classification logits.
            gt_bboxes (Tensor): ``[num_gt, 9]`` (or ``[num_gt, 7]``) ground
                truth ``(x, y, z, w, l, h, yaw, vx, vy)``, ``(x, y, z)`` the
                gravity centre.
            gt_labels (Tensor): ``[num_gt]`` class indices.
            gt_bboxes_ignore (Tensor, optional): not supported; must be None.
            code_weights (Sequence[float], optional): overrides the weights
                given at construction for this call.
            with_velo (bool): include the velocity code values in the
                regression cost.

        Returns:
            AssignResult: ``gt_inds [num_query]`` (0 background, ``j + 1`` for
            ground truth ``j``), ``labels [num_query]`` (-1 for background).
        """
        if gt_bboxes_ignore is not None:
            raise ValueError('HungarianAssigner3D does not support gt_bboxes_ignore; pass None')
        if bbox_pred.size(0) != cls_pred.size(0):
            raise ValueError(f'bbox_pred has {bbox_pred.size(0)} queries but cls_pred has {cls_pred.size(0)}')
        if gt_bboxes.size(0) != gt_labels.size(0):
            raise ValueError(f'{gt_bboxes.size(0)} gt boxes but {gt_labels.size(0)} gt labels')
        num_gts, num_queries = gt_bboxes.size(0), bbox_pred.size(0)
        device = bbox_pred.device
        assigned_gt_inds = torch.zeros(num_queries, dtype=torch.long, device=device)
        assigned_labels = torch.full((num_queries, ), -1, dtype=torch.long, device=device)
        if num_gts == 0 or num_queries == 0:
            return AssignResult(num_gts, assigned_gt_inds, None, labels=assigned_labels)

        gt_codes = normalize_bbox(gt_bboxes.to(bbox_pred.dtype), self.pc_range)
        num_code = bbox_pred.size(-1) if with_velo else _CODE_SIZE_NO_VELOCITY
        if gt_codes.size(-1) < num_code or bbox_pred.size(-1) < num_code:
            raise ValueError(f'with_velo={with_velo} needs {num_code} code values; got predictions '
                             f'{tuple(bbox_pred.shape)} and encoded gt {tuple(gt_codes.shape)}')
        weights = self.code_weights if code_weights is None else code_weights
        pred_codes = bbox_pred
        if weights is not None:
            weight_row = device_constant(weights, bbox_pred.device, bbox_pred.dtype)[:bbox_pred.size(-1)]
            pred_codes = bbox_pred * weight_row
            gt_codes = gt_codes * weight_row[:gt_codes.size(-1)]
        cost = self.cls_cost(cls_pred, gt_labels) + self.reg_cost(pred_codes[:, :num_code], gt_codes[:, :num_code])

        cost = cost.detach().float().cpu()
        if not torch.isfinite(cost).all():
            raise ValueError('HungarianAssigner3D: the matching cost has non-finite entries (NaN/inf predictions, '
                             'or ground-truth boxes with non-positive sizes)')
        query_inds, gt_inds = linear_sum_assignment(cost.numpy())
        query_inds = host_to_device(query_inds, device, torch.long)
        gt_inds = host_to_device(gt_inds, device, torch.long)
        assigned_gt_inds[query_inds] = gt_inds + 1
        assigned_labels[query_inds] = gt_labels[gt_inds].long()
        return AssignResult(num_gts, assigned_gt_inds, None, labels=assigned_labels)
