"""Matching costs of CMT's Hungarian assignment (mmdet ``MATCH_COST`` registry).

Each cost is a callable object built from a config dict
(``dict(type='BBox3DL1Cost', weight=0.25)``) that returns a
``[num_query, num_gt]`` cost matrix scaled by ``weight``.
"""
from typing import Sequence

import torch
from mmdet.core.bbox.match_costs.builder import MATCH_COST

from ....utils.host_data import device_constant


@MATCH_COST.register_module()
class BBox3DL1Cost:
    """L1 distance between encoded boxes.

    Args:
        weight (float): scale of the cost. Default 1.0.
    """

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight

    def __call__(self, bbox_pred: torch.Tensor, gt_bboxes: torch.Tensor) -> torch.Tensor:
        """
        Args:
            bbox_pred (Tensor): ``[num_query, D]`` predicted box codes.
            gt_bboxes (Tensor): ``[num_gt, D]`` target box codes (same encoding).

        Returns:
            Tensor: ``[num_query, num_gt]`` weighted L1 distances.
        """
        if bbox_pred.size(-1) != gt_bboxes.size(-1):
            raise ValueError(f'BBox3DL1Cost: prediction and target codes differ in size '
                             f'({bbox_pred.size(-1)} vs {gt_bboxes.size(-1)})')
        return torch.cdist(bbox_pred, gt_bboxes, p=1) * self.weight


@MATCH_COST.register_module()
class BBoxBEVL1Cost:
    """L1 distance between BEV centres, normalised to ``[0, 1]`` by the point-cloud range.

    Args:
        weight (float): scale of the cost.
    """

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight

    def __call__(self, bboxes: torch.Tensor, gt_bboxes: torch.Tensor, pc_range: Sequence[float]) -> torch.Tensor:
        """
        Args:
            bboxes (Tensor): ``[num_query, >=2]`` boxes whose first two values are the centre ``(x, y)`` in metres.
            gt_bboxes (Tensor): ``[num_gt, >=2]`` same for the ground truth.
            pc_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]``.

        Returns:
            Tensor: ``[num_query, num_gt]`` weighted L1 distances of the normalised centres.
        """
        if len(pc_range) != 6:
            raise ValueError(f'BBoxBEVL1Cost: pc_range must have 6 values, got {list(pc_range)}')
        start = device_constant(pc_range[0:2], bboxes.device, bboxes.dtype)
        extent = device_constant(pc_range[3:5], bboxes.device, bboxes.dtype) - start
        pred_xy = (bboxes[:, :2] - start) / extent
        gt_xy = (gt_bboxes[:, :2] - start) / extent
        return torch.cdist(pred_xy, gt_xy, p=1) * self.weight


@MATCH_COST.register_module()
class IoU3DCost:
    """Negative IoU as a cost (the IoU matrix is computed by the caller).

    Args:
        weight (float): scale of the cost.
    """

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight

    def __call__(self, iou: torch.Tensor) -> torch.Tensor:
        """
        Args:
            iou (Tensor): ``[num_query, num_gt]`` IoU between predictions and ground truth.

        Returns:
            Tensor: ``[num_query, num_gt]`` ``-iou * weight``.
        """
        return -iou * self.weight
