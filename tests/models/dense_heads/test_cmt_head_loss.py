"""DetectionLoss: CMT's matching and DN losses as a part of the head, read from HeadOutputs by attribute."""
import pytest
import torch

import projects.mmdet3d_plugin  # noqa: F401
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
