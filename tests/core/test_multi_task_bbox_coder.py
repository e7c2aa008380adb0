"""MultiTaskBBoxCoder decodes the head's per-task prediction dicts into boxes."""
import math

import pytest
import torch
from mmdet.core.bbox.builder import build_bbox_coder

import projects.mmdet3d_plugin  # noqa: F401

PC_RANGE = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]


def _coder(**kwargs):
    cfg = dict(type='MultiTaskBBoxCoder', pc_range=PC_RANGE, post_center_range=[-61.2, -61.2, -10.0, 61.2, 61.2, 10.0],
               max_num=300, voxel_size=[0.075, 0.075, 0.2], num_classes=3)
    cfg.update(kwargs)
    return build_bbox_coder(cfg)


def _task_preds(num_classes, layers=2, bs=2, queries=4, logit=-10.0):
    return dict(center=torch.zeros(layers, bs, queries, 2), height=torch.zeros(layers, bs, queries, 1),
                dim=torch.zeros(layers, bs, queries, 3), rot=torch.zeros(layers, bs, queries, 2),
                vel=torch.zeros(layers, bs, queries, 2),
                cls_logits=torch.full((layers, bs, queries, num_classes), logit))


def _two_tasks():
    """Task 0 predicts class 0, task 1 classes 1 and 2 (global indices)."""
    task0, task1 = _task_preds(1), _task_preds(2)
    # sample 0: the best pair is (query 3, global class 2) -> box of task 1, query 3
    task1['cls_logits'][-1, 0, 3, 1] = 4.0
    task1['center'][-1, 0, 3] = torch.tensor([12.0, -7.0])
    task1['height'][-1, 0, 3] = math.log(2.0)  # code slot 2: log w
    task1['dim'][-1, 0, 3] = torch.tensor([math.log(4.0), -0.5, math.log(1.5)])  # log l, cz, log h
    task1['rot'][-1, 0, 3] = torch.tensor([1.0, 0.0])  # yaw pi/2
    task1['vel'][-1, 0, 3] = torch.tensor([0.3, -0.2])
    # the same query of task 0 has another box: it must not be picked for class 2
    task0['center'][-1, 0, 3] = torch.tensor([-30.0, 30.0])
    # earlier decoder layers are ignored
    task0['cls_logits'][0] = 10.0
    return [[task0], [task1]]


def test_decodes_the_box_of_the_class_task():
    results = _coder(max_num=1).decode(_two_tasks())
    assert len(results) == 2
    first = results[0]
    assert first['labels'].tolist() == [2]
    torch.testing.assert_close(first['scores'], torch.tensor([4.0]).sigmoid())
    expected = torch.tensor([[12.0, -7.0, -0.5, 2.0, 4.0, 1.5, math.pi / 2, 0.3, -0.2]])
    torch.testing.assert_close(first['bboxes'], expected)


def test_results_are_sorted_and_capped():
    results = _coder(max_num=5).decode(_two_tasks())
    for result in results:
        assert result['bboxes'].shape == (5, 9)
        assert torch.all(result['scores'][:-1] >= result['scores'][1:])
    # max_num larger than queries x classes keeps every pair
    assert _coder(max_num=300).decode(_two_tasks())[1]['scores'].numel() == 4 * 3


def test_filters_by_centre_range_and_score():
    preds = _two_tasks()
    preds[1][0]['center'][-1, 0, 3] = torch.tensor([100.0, 0.0])  # outside post_center_range
    first = _coder(max_num=12).decode(preds)[0]
    assert 2 not in first['labels'][first['scores'] > 0.5].tolist()
    assert (first['bboxes'][:, 0] <= 61.2).all()
    high = _coder(max_num=12, score_threshold=0.5, post_center_range=None).decode(_two_tasks())
    assert high[0]['labels'].tolist() == [2]
    assert high[1]['labels'].numel() == 0


def test_bad_predictions_raise():
    with pytest.raises(ValueError, match='num_classes'):
        _coder(num_classes=10).decode(_two_tasks())
    preds = _two_tasks()
    del preds[0][0]['vel']
    with pytest.raises(KeyError, match='vel'):
        _coder().decode(preds)
