"""Decoding of CMT's multi-task head outputs into scored 3D boxes (NMS-free)."""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmdet.core.bbox import BaseBBoxCoder
from mmdet.core.bbox.builder import BBOX_CODERS

from ....utils.host_data import device_constant
from ..util import denormalize_bbox

# Order in which the head's regression outputs are concatenated into one code;
# the slots then follow the normalize_bbox encoding (CMT's convention).
_REG_KEYS = ('center', 'height', 'dim', 'rot', 'vel')


def pair_rows(flat_inds: torch.Tensor, num_classes: int, num_query: int,
              class_to_task: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Labels, queries and box-code rows of flat ``query * num_classes + class`` indices (any shape): the row
    of a pair is its class's task's box of its query, ``task * num_query + query``
    (:meth:`MultiTaskBBoxCoder.last_layer`'s layout)."""
    labels = flat_inds % num_classes
    queries = torch.div(flat_inds, num_classes, rounding_mode='floor')
    return labels, queries, class_to_task[labels] * num_query + queries


@BBOX_CODERS.register_module()
class MultiTaskBBoxCoder(BaseBBoxCoder):
    """Top-k decoding over the classes of all task heads.

    Each task head ``t`` predicts ``C_t`` class logits and one box per query.
    The tasks' class logits are concatenated into ``C = sum(C_t)`` global
    classes (task order = class order), the ``max_num`` best
    ``(query, class)`` pairs are kept, and each pair takes the box that the
    class's task head predicted for that query.

    Args:
        pc_range (Sequence[float]): point-cloud range
            ``[x_min, y_min, z_min, x_max, y_max, z_max]``.
        voxel_size (Sequence[float], optional): stored as ``self.voxel_size``
            for heads that read it; decoding does not use it.
        post_center_range (Sequence[float], optional): boxes whose centre is
            outside ``[x_min, y_min, z_min, x_max, y_max, z_max]`` are dropped.
            None keeps all.
        max_num (int): number of boxes kept per sample before filtering.
        score_threshold (float, optional): boxes scoring ``<=`` this are dropped.
        num_classes (int): total number of classes over all tasks.
    """

    def __init__(self,
                 pc_range: Sequence[float],
                 voxel_size: Optional[Sequence[float]] = None,
                 post_center_range: Optional[Sequence[float]] = None,
                 max_num: int = 100,
                 score_threshold: Optional[float] = None,
                 num_classes: int = 10) -> None:
        if post_center_range is not None and len(post_center_range) != 6:
            raise ValueError(f'post_center_range must have 6 values, got {list(post_center_range)}')
        if max_num <= 0:
            raise ValueError(f'max_num must be positive, got {max_num}')
        self.pc_range = pc_range
        self.voxel_size = voxel_size
        self.post_center_range = post_center_range
        self.max_num = max_num
        self.score_threshold = score_threshold
        self.num_classes = num_classes

    def encode(self) -> None:
        """Encoding is done by :func:`normalize_bbox` in the head's loss, not here."""
        raise NotImplementedError('MultiTaskBBoxCoder only decodes; encode targets with normalize_bbox')

    def decode_single(self, cls_logits: torch.Tensor, bbox_codes: torch.Tensor,
                      class_to_task: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Decode one sample.

        Args:
            cls_logits (Tensor): ``[num_query, num_classes]`` logits of all tasks
                (global class order).
            bbox_codes (Tensor): ``[num_tasks * num_query, 10]`` box codes, task
                ``t``'s boxes at rows ``t * num_query ... (t + 1) * num_query - 1``.
            class_to_task (Tensor): ``[num_classes]`` long, the task of each class.

        Returns:
            dict: ``bboxes [N, 9]`` ``(x, y, z, w, l, h, yaw, vx, vy)`` with
            ``(x, y, z)`` the gravity centre, ``scores [N]``, ``labels [N]``
            (global class index), sorted by decreasing score.
        """
        num_query, num_classes = cls_logits.shape
        scores, flat_inds = cls_logits.sigmoid().reshape(-1).topk(min(self.max_num, cls_logits.numel()))
        labels, _, rows = pair_rows(flat_inds, num_classes, num_query, class_to_task)
        bboxes = denormalize_bbox(bbox_codes[rows], self.pc_range)

        keep = torch.ones_like(scores, dtype=torch.bool)
        if self.score_threshold is not None:
            keep &= scores > self.score_threshold
        if self.post_center_range is not None:
            limits = device_constant(self.post_center_range, bboxes.device, bboxes.dtype)
            keep &= (bboxes[:, :3] >= limits[:3]).all(1) & (bboxes[:, :3] <= limits[3:]).all(1)
        return dict(bboxes=bboxes[keep], scores=scores[keep], labels=labels[keep])

    def decode(self, preds_dicts: Sequence[Sequence[Dict[str, torch.Tensor]]]) -> List[Dict[str, torch.Tensor]]:
        """Decode the last decoder layer's predictions of every task head (:meth:`last_layer`).

        Returns:
            list[dict]: one dict per sample, see :meth:`decode_single`.
        """
        all_logits, all_codes, class_to_task = self.last_layer(preds_dicts)
        return [
            self.decode_single(all_logits[i], all_codes[i], class_to_task) for i in range(all_logits.size(0))
        ]

    def last_layer(self, preds_dicts: Sequence[Sequence[Dict[str, torch.Tensor]]]
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The last decoder layer's predictions of every task head, in one layout.

        Args:
            preds_dicts (Sequence[Sequence[dict]]): ``preds_dicts[task][0]`` is
                the prediction dict of task ``task`` (the inner list holds one
                entry per feature level; CMT has one). Each dict holds, for
                ``L`` decoder layers, ``B`` samples and ``Q`` queries:
                ``center [L, B, Q, 2]`` (metres), ``height [L, B, Q, 1]``,
                ``dim [L, B, Q, 3]``, ``rot [L, B, Q, 2]``, ``vel [L, B, Q, 2]``
                and ``cls_logits [L, B, Q, C_t]``. The five regression outputs
                are concatenated in that order into the 10-value code of
                :func:`normalize_bbox`; only layer ``-1`` is decoded.

        Returns:
            tuple[Tensor]: ``logits [B, Q, C]`` (global class order), ``codes [B, T * Q, 10]`` (task ``t``'s
            boxes at rows ``t * Q ... (t + 1) * Q - 1``) and ``class_to_task [C]`` (long).
        """
        if len(preds_dicts) == 0:
            raise ValueError('MultiTaskBBoxCoder.decode got no task predictions')
        codes, logits, class_to_task = [], [], []
        for task_id, task_levels in enumerate(preds_dicts):
            if len(task_levels) == 0:
                raise ValueError(f'task {task_id} has no prediction dict')
            preds = task_levels[0]
            missing = [key for key in _REG_KEYS + ('cls_logits', ) if key not in preds]
            if missing:
                raise KeyError(f'task {task_id} predictions lack {missing}; got keys {sorted(preds)}')
            codes.append(torch.cat([preds[key][-1] for key in _REG_KEYS], dim=-1))
            task_logits = preds['cls_logits'][-1]
            logits.append(task_logits)
            class_to_task += [task_id] * task_logits.size(-1)
        all_logits = torch.cat(logits, dim=-1)  # [B, Q, C]
        all_codes = torch.cat(codes, dim=1)  # [B, T * Q, 10]
        if all_logits.size(-1) != self.num_classes:
            raise ValueError(f'the task heads predict {all_logits.size(-1)} classes in total but the coder has '
                             f'num_classes={self.num_classes}')
        return all_logits, all_codes, device_constant(class_to_task, all_logits.device, torch.long)
