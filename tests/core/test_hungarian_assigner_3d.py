"""HungarianAssigner3D: optimal one-to-one matching, empty ground truth, clear errors."""
import pytest
import torch
from mmdet.core.bbox.builder import build_assigner

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.core.bbox.util import normalize_bbox

PC_RANGE = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]


def _assigner(**kwargs):
    cfg = dict(type='HungarianAssigner3D', cls_cost=dict(type='FocalLossCost', weight=2.0),
               reg_cost=dict(type='BBox3DL1Cost', weight=0.25), iou_cost=dict(type='IoUCost', weight=0.0),
               pc_range=PC_RANGE)
    cfg.update(kwargs)
    return build_assigner(cfg)


def _gt():
    boxes = torch.tensor([[10.0, 5.0, -1.0, 2.0, 4.5, 1.6, 0.3, 1.0, 0.0],
                          [-20.0, 3.0, 0.0, 0.6, 0.7, 1.8, -1.2, 0.0, 0.5]])
    return boxes, torch.tensor([0, 8])


def test_matches_the_query_next_to_each_box():
    gt_boxes, gt_labels = _gt()
    codes = torch.zeros(4, 10)
    codes[:, 7] = 1.0
    codes[3] = normalize_bbox(gt_boxes[0:1])[0] + 0.01
    codes[1] = normalize_bbox(gt_boxes[1:2])[0] - 0.01
    logits = torch.zeros(4, 10)
    result = _assigner().assign(codes, logits, gt_boxes, gt_labels)
    assert result.num_gts == 2
    assert result.gt_inds.tolist() == [0, 2, 0, 1]
    assert result.labels.tolist() == [-1, 8, -1, 0]


def test_empty_ground_truth_makes_every_query_background():
    result = _assigner().assign(torch.randn(6, 10), torch.randn(6, 10), torch.zeros(0, 9),
                                torch.zeros(0, dtype=torch.long))
    assert result.num_gts == 0
    assert result.gt_inds.tolist() == [0] * 6
    assert result.labels.tolist() == [-1] * 6


def test_velocity_only_counts_with_velo():
    gt_boxes, gt_labels = _gt()
    gt_boxes = gt_boxes[:1]
    gt_labels = gt_labels[:1]
    code = normalize_bbox(gt_boxes)[0]
    codes = torch.stack([code, code])
    codes[0, 8:] += 50.0  # query 0: wrong velocity, slightly better position
    codes[1, :2] += 0.5  # query 1: right velocity, worse position
    logits = torch.zeros(2, 10)
    assigner = _assigner(code_weights=[2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2])
    assert assigner.assign(codes, logits, gt_boxes, gt_labels).gt_inds.tolist() == [1, 0]
    assert assigner.assign(codes, logits, gt_boxes, gt_labels, with_velo=True).gt_inds.tolist() == [0, 1]


def test_classification_cost_decides_between_equal_boxes():
    gt_boxes, gt_labels = _gt()
    codes = normalize_bbox(gt_boxes[:1]).repeat(2, 1)
    logits = torch.full((2, 10), -5.0)
    logits[1, 0] = 5.0  # query 1 is confident about class 0
    result = _assigner().assign(codes, logits, gt_boxes[:1], gt_labels[:1])
    assert result.gt_inds.tolist() == [0, 1]


def test_bad_inputs_raise():
    gt_boxes, gt_labels = _gt()
    codes = torch.zeros(3, 10)
    codes[0, 0] = float('nan')
    with pytest.raises(ValueError, match='non-finite'):
        _assigner().assign(codes, torch.zeros(3, 10), gt_boxes, gt_labels)
    with pytest.raises(ValueError, match='gt_bboxes_ignore'):
        _assigner().assign(torch.zeros(3, 10), torch.zeros(3, 10), gt_boxes, gt_labels, torch.zeros(1, 9))
    with pytest.raises(ValueError, match='iou_cost'):
        _assigner(iou_cost=dict(type='IoUCost', weight=1.0))
    with pytest.raises(ValueError, match='queries'):
        _assigner().assign(torch.zeros(3, 10), torch.zeros(2, 10), gt_boxes, gt_labels)
