"""mmdet3d's ObjectRangeFilter under numpy 1.26 (setup_env.sh patches the removed np.bool alias): boxes and labels stay together."""
import numpy as np
import torch
from mmcv.utils import build_from_cfg
from mmdet3d.datasets.builder import PIPELINES
from mmdet3d.core.bbox import LiDARInstance3DBoxes

import projects.mmdet3d_plugin  # noqa: F401


def _boxes(centres_xy, yaw=0.0):
    rows = [[x, y, -1.0, 4.0, 2.0, 1.5, yaw] for x, y in centres_xy]
    return LiDARInstance3DBoxes(torch.tensor(rows, dtype=torch.float32).reshape(-1, 7))


def test_keeps_the_boxes_in_range_with_their_labels():
    range_filter = build_from_cfg(dict(type='ObjectRangeFilter', point_cloud_range=[-10, -10, -5, 10, 10, 3]),
                                  PIPELINES)
    results = range_filter(dict(gt_bboxes_3d=_boxes([(1, 1), (12, 0), (-9, 9), (0, -11)], yaw=4.0),
                                gt_labels_3d=np.array([3, 1, 4, 1])))
    assert results['gt_labels_3d'].tolist() == [3, 4]
    np.testing.assert_allclose(results['gt_bboxes_3d'].tensor[:, :2].numpy(), [[1, 1], [-9, 9]])
    assert (results['gt_bboxes_3d'].yaw.abs() <= np.pi).all()  # yaw limited to [-pi, pi)


def test_single_box_and_empty_inputs():
    range_filter = build_from_cfg(dict(type='ObjectRangeFilter', point_cloud_range=[-10, -10, -5, 10, 10, 3]),
                                  PIPELINES)
    results = range_filter(dict(gt_bboxes_3d=_boxes([(20, 0)]), gt_labels_3d=np.array([7])))
    assert len(results['gt_bboxes_3d']) == 0 and results['gt_labels_3d'].shape == (0, )
    results = range_filter(dict(gt_bboxes_3d=_boxes([]), gt_labels_3d=np.zeros(0, dtype=np.int64)))
    assert len(results['gt_bboxes_3d']) == 0
