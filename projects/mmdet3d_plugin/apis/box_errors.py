"""Where a detector's heading and velocity errors come from, per class.

The devkit's mAOE and mAVE average the errors of its true positives; these
functions split them. Each ground-truth object is matched, greedily by
descending score, to the nearest unmatched detection of its class within
``max_distance`` (BEV centre distance, as the devkit's 2 m threshold). For the
matched pairs:

* heading: the share ``right`` (error below 45 degrees), ``sideways`` (45 to
  135: the box lies across its object) and ``flipped`` (above 135: front and
  back swapped), the median error and the median error modulo pi (the
  orientation of the box's long axis only): a model that has not learned
  heading scores about 0.25 / 0.5 / 0.25 and 90 / 45 degrees;
* velocity: the mean error and the mean error of predicting zero.

``dataset_matches`` matches a test run's outputs; the rest are pure functions of tensors.
"""
from dataclasses import dataclass
from typing import List, Sequence

import torch
from torch import Tensor

QUARTER_TURN = torch.pi / 4


@dataclass
class MatchedBoxes:
    """The matched pairs of one or more samples: ``[n]`` classes, ``[n]`` headings and ``[n, 2]`` velocities."""

    labels: Tensor
    gt_yaw: Tensor
    det_yaw: Tensor
    gt_velocity: Tensor
    det_velocity: Tensor

    @staticmethod
    def cat(matches: Sequence['MatchedBoxes']) -> 'MatchedBoxes':
        return MatchedBoxes(*(torch.cat([getattr(m, name) for m in matches]) for name in MatchedBoxes.__annotations__))


def match_boxes(gt_boxes: Tensor, gt_labels: Tensor, det_boxes: Tensor, det_labels: Tensor, det_scores: Tensor,
                max_distance: float = 2.0) -> MatchedBoxes:
    """Match detections to ground truth of their class (see the module docstring).

    Args:
        gt_boxes (Tensor): ``[n, 9]`` LiDAR boxes ``(x, y, z, l, w, h, yaw, vx, vy)``.
        gt_labels (Tensor): ``[n]``.
        det_boxes (Tensor): ``[m, 9]``.
        det_labels (Tensor): ``[m]``.
        det_scores (Tensor): ``[m]``.
        max_distance (float): largest BEV centre distance of a match, metres.
    """
    distance = torch.cdist(det_boxes[:, :2].double(), gt_boxes[:, :2].double())
    distance[det_labels[:, None] != gt_labels[None, :]] = float('inf')
    gt_taken = torch.zeros(len(gt_boxes), dtype=torch.bool)
    pairs: List[List[int]] = []
    for det in torch.argsort(det_scores, descending=True).tolist():
        row = distance[det].masked_fill(gt_taken, float('inf'))
        if len(row) and row.min() <= max_distance:
            gt = int(row.argmin())
            gt_taken[gt] = True
            pairs.append([det, gt])
    det_index, gt_index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).T
    return MatchedBoxes(gt_labels[gt_index], gt_boxes[gt_index, 6], det_boxes[det_index, 6], gt_boxes[gt_index, 7:9],
                        det_boxes[det_index, 7:9])


def dataset_matches(dataset, outputs: Sequence[dict], score_threshold: float, max_distance: float = 2.0
                    ) -> MatchedBoxes:
    """The matches of every sample of ``dataset`` (its ``get_ann_info``) with ``outputs`` (``single_gpu_test``'s, in
    dataset order), detections scoring below ``score_threshold`` left out."""
    matches = []
    for index, output in enumerate(outputs):
        ann = dataset.get_ann_info(index)
        det = output['pts_bbox']
        keep = det['scores_3d'] >= score_threshold
        matches.append(match_boxes(ann['gt_bboxes_3d'].tensor, torch.as_tensor(ann['gt_labels_3d']),
                                   det['boxes_3d'].tensor[keep], det['labels_3d'][keep], det['scores_3d'][keep],
                                   max_distance))
    return MatchedBoxes.cat(matches)


def heading_error(gt_yaw: Tensor, det_yaw: Tensor) -> Tensor:
    """``[n]`` absolute heading error in ``[0, pi]`` radians."""
    return torch.remainder(det_yaw - gt_yaw + torch.pi, 2 * torch.pi).sub(torch.pi).abs()


def error_table(matches: MatchedBoxes, class_names: Sequence[str]) -> str:
    """A Markdown table of the module docstring's shares and errors, one row per class and one for all."""
    lines = ['| class | matched | right < 45° | sideways | flipped > 135° | median error (°) | median axis error (°) '
             '| velocity error (m/s) | zero velocity (m/s) |', '|---|---:|---:|---:|---:|---:|---:|---:|---:|']
    for name, keep in [(name, matches.labels == c) for c, name in enumerate(class_names)] + [
            ('all', torch.ones_like(matches.labels, dtype=torch.bool))]:
        if not keep.any():
            continue
        error = heading_error(matches.gt_yaw[keep], matches.det_yaw[keep]).double()
        axis = torch.minimum(error, torch.pi - error)
        right, flipped = (error < QUARTER_TURN).double().mean(), (error > 3 * QUARTER_TURN).double().mean()
        velocity = (matches.det_velocity[keep] - matches.gt_velocity[keep]).norm(dim=-1).double().mean()
        zero = matches.gt_velocity[keep].norm(dim=-1).double().mean()
        lines.append(f'| {name} | {int(keep.sum())} | {right:.2f} | {1 - right - flipped:.2f} | {flipped:.2f} | '
                     f'{error.median().rad2deg():.0f} | {axis.median().rad2deg():.0f} | {velocity:.2f} | {zero:.2f} |')
    return '\n'.join(lines)
