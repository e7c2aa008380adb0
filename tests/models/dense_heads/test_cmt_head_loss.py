"""DetectionLoss: CMT's matching and DN losses as a part of the head, read from HeadOutputs by attribute."""
import pytest
import torch

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.core.bbox.util import AXIS_EPS, heading_axis, normalize_bbox
from projects.mmdet3d_plugin.models.dense_heads.cmt_head_loss import DetectionLoss
from projects.mmdet3d_plugin.models.dense_heads.head_outputs import HeadOutputs, PassOutputs
from projects.mmdet3d_plugin.models.utils.denoising import DenoisingConfig
from test_cmt_head import features, head_cfg

LOSSES = dict(loss_cls=dict(type='FocalLoss', use_sigmoid=True, loss_weight=2.0),
              loss_bbox=dict(type='L1Loss', loss_weight=0.25))


def test_a_loss_without_train_cfg_has_no_state_and_cannot_compute():
    loss = DetectionLoss([3, 2], train_cfg=None, denoising=DenoisingConfig(), **LOSSES)
    assert loss.assigner is None and not list(loss.state_dict())
    with pytest.raises(RuntimeError, match='without train_cfg'):
        loss([], [], HeadOutputs(([dict(cls_logits=torch.zeros(1, 1, 1, 3))], )))


def test_labels_are_checked_only_when_asked(cmt_test_data):
    loss = head_cfg().detection_loss
    boxes, labels = [cmt_test_data['random_boxes'](2)], [torch.tensor([0, 9])]
    gravity, long_labels = loss.gt_boxes_and_labels(boxes, labels, torch.device('cpu'), check_classes=False)
    assert gravity[0].shape == (2, 9) and long_labels[0].dtype == torch.long
    with pytest.raises(ValueError, match=r'labels must be in \[0, 5\)'):
        loss.gt_boxes_and_labels(boxes, labels, torch.device('cpu'))


def test_a_single_modality_pass_logs_its_samples_and_weighs_the_others_zero(cmt_test_data):
    head = head_cfg(scalar=0).train()
    bev, img = features()
    boxes = [cmt_test_data['random_boxes'](2), cmt_test_data['random_boxes'](1)]
    labels = [torch.tensor([0, 3]), torch.tensor([1])]
    outputs = head([bev], [img], cmt_test_data['make_img_metas'](2), boxes, labels)
    half = HeadOutputs(outputs.tasks, passes=dict(camera=PassOutputs(outputs.tasks, (True, False))))
    losses = head.detection_loss(boxes, labels, half)
    assert losses['camera.num_samples'] == 1 and 'num_samples' not in losses
    alone = head.detection_loss(boxes[:1], labels[:1], HeadOutputs(tuple([{k: v[:, :1] for k, v in task[0].items()}]
                                                                         for task in outputs.tasks)))
    torch.testing.assert_close(losses['camera.loss_bbox'], alone['loss_bbox'])
    assert not torch.equal(losses['camera.loss_bbox'], losses['loss_bbox'])


def test_heading_axis_is_the_double_angle_the_same_for_a_heading_and_its_reverse():
    angles = torch.tensor([0.3, -2.0, 1.5])
    unit = torch.stack((angles.sin(), angles.cos()), dim=-1)
    torch.testing.assert_close(heading_axis(unit), torch.stack(((2 * angles).sin(), (2 * angles).cos()), dim=-1))
    torch.testing.assert_close(heading_axis(-unit), heading_axis(unit))
    torch.testing.assert_close(heading_axis(0.2 * unit), heading_axis(unit))
    assert heading_axis(torch.zeros(1, 2), AXIS_EPS).abs().max() == 0


@pytest.mark.parametrize('turn, axis_penalty', [(torch.pi, False), (torch.pi / 2, True)],
                         ids=['reversed', 'perpendicular'])
def test_the_heading_axis_term_penalises_a_wrong_axis_not_a_reversed_heading(turn, axis_penalty):
    yaw = torch.tensor([0.4, -1.2])
    boxes = torch.tensor([[1.0, 2.0, 0.5, 2.0, 4.0, 1.5, 0.0, 0.5, 0.0]]).repeat(2, 1)
    boxes[:, 6] = yaw
    pred = normalize_bbox(boxes)
    pred[:, 6], pred[:, 7] = (yaw + turn).sin(), (yaw + turn).cos()

    assigner = head_cfg().detection_loss.train_cfg['assigner']

    def loss(**train_cfg):
        detection = DetectionLoss([3], train_cfg=dict(assigner=assigner, code_weights=[1.0] * 10, **train_cfg),
                                  denoising=DenoisingConfig(), **dict(LOSSES, loss_bbox=dict(type='L1Loss')))
        return detection._code_l1_loss(pred, boxes, avg_factor=2.0)

    plain, with_axis = loss(), loss(heading_axis_weight=2.0)
    torch.testing.assert_close(loss(heading_axis_weight=0.0), plain)
    if axis_penalty:  # the axis is off by 90 degrees: |sin 2a'- sin 2a| + |cos 2a' - cos 2a| per box
        expected = 2.0 * (heading_axis(pred[:, 6:8]) - heading_axis(normalize_bbox(boxes)[:, 6:8])).abs().sum() / 2
        torch.testing.assert_close(with_axis - plain, expected, atol=0.05, rtol=0.02)
        assert with_axis - plain > 1.0
    else:
        assert with_axis - plain < 0.05
