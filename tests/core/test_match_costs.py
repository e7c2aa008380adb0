"""The registered match costs compute weighted [num_query, num_gt] matrices."""
import pytest
import torch
from mmdet.core.bbox.match_costs import build_match_cost

import projects.mmdet3d_plugin  # noqa: F401


def test_bbox3d_l1_cost():
    cost = build_match_cost(dict(type='BBox3DL1Cost', weight=0.5))
    pred = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    gt = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(cost(pred, gt), torch.tensor([[3.0], [1.5]]))
    with pytest.raises(ValueError, match='differ in size'):
        cost(pred, torch.zeros(1, 4))


def test_bbox_bev_l1_cost_normalises_by_range():
    cost = build_match_cost(dict(type='BBoxBEVL1Cost', weight=2.0))
    pc_range = [-10.0, -20.0, -5.0, 10.0, 20.0, 3.0]
    pred = torch.tensor([[0.0, 0.0, 7.0]])
    gt = torch.tensor([[10.0, 20.0, -1.0], [0.0, 0.0, 99.0]])
    # (10/20 + 20/40) * 2 = 2; z is ignored
    torch.testing.assert_close(cost(pred, gt, pc_range), torch.tensor([[2.0, 0.0]]))


def test_iou3d_cost():
    cost = build_match_cost(dict(type='IoU3DCost', weight=3.0))
    torch.testing.assert_close(cost(torch.tensor([[0.5, 0.0]])), torch.tensor([[-1.5, 0.0]]))
