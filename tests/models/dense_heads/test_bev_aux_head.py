"""BevAuxHead: dense heatmap, heading and velocity targets on the BEV memory, and CmtHead's aids."""
import dataclasses
import math

import pytest
import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.config_upgrade import upgrade_model_config
from projects.mmdet3d_plugin.models.dense_heads.bev_aux_head import BevAuxHead
from test_cmt_head import features, head_cfg
from test_image_aux_head import IMAGE_HEAD, gts, train_losses

PC_RANGE = [-16.0, -8.0, -5.0, 16.0, 8.0, 3.0]  # a 32 x 16 m map: cells of 2 m on an 8 x 16 map
BEV_AUX = dict(type='BevAuxHead', feat_channels=8)
BEV_AUX_LOSSES = {'bev_aux.loss_heatmap', 'bev_aux.loss_heading', 'bev_aux.loss_velocity'}


def aux_head(**kwargs):
    head = BevAuxHead(in_channels=4, num_classes=3, pc_range=PC_RANGE, **kwargs)
    head.init_weights()
    return head


def boxes_of(rows):
    return LiDARInstance3DBoxes(torch.tensor(rows, dtype=torch.float32), box_dim=9)


def test_targets_put_each_centre_on_its_cell_with_its_heading_and_velocity():
    rows = [[3.0, -5.0, -1.0, 4.0, 2.0, 1.5, 0.5, 2.0, -1.0],  # cell x = 19 // 2 = 9, y = 3 // 2 = 1
            [20.0, 0.0, -1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]]  # off the map
    heatmap, flat_index, regression, sample = aux_head().targets(
        (8, 16), [boxes_of(rows[:1]), boxes_of(rows)], [torch.tensor([2]), torch.tensor([1, 0])], torch.device('cpu'))
    assert heatmap.shape == (2, 3, 8, 16)
    assert flat_index.tolist() == [1 * 16 + 9, 8 * 16 + 1 * 16 + 9]
    assert sample.tolist() == [0, 1]
    expected = torch.tensor([math.sin(0.5), math.cos(0.5), 2.0, -1.0])
    assert torch.allclose(regression, expected.expand(2, -1))
    assert heatmap[0, 2, 1, 9] == 1 and heatmap[1, 1, 1, 9] == 1
    assert heatmap[0, :2].max() == 0 and heatmap[1, 0].max() == 0 and heatmap[1, 2].max() == 0


def test_regression_losses_are_read_at_the_centre_cells_only():
    head = aux_head()
    rows = [[3.0, -5.0, -1.0, 4.0, 2.0, 1.5, 0.5, 2.0, -1.0]]
    outputs = head(torch.zeros(1, 4, 8, 16), [{}])
    outputs.regression = torch.randn(1, 4, 8, 16)
    outputs.regression[0, :, 1, 9] = torch.tensor([math.sin(0.5), math.cos(0.5), 2.0, -1.0])
    perfect = head.loss(outputs, [boxes_of(rows)], [torch.tensor([2])])
    assert perfect['loss_heading'] < 0.02 and perfect['loss_velocity'] == 0  # the axis term's eps leaves a trace
    outputs.regression[0, 0, 1, 9] += 1.0
    outputs.regression[0, 2, 1, 9] += 2.0
    outputs.regression[0, :, 0, 0] += 5.0  # another cell: not read
    losses = head.loss(outputs, [boxes_of(rows)], [torch.tensor([2])])
    assert losses['loss_heading'] > perfect['loss_heading'] + 1.0  # L1 on sin: 1.0, and the axis moved
    assert torch.isclose(losses['loss_velocity'], torch.tensor(0.25 * 2.0))


def test_samples_without_their_points_weigh_nothing():
    head = aux_head().eval()  # BatchNorm with its running statistics: a sample's maps do not depend on the batch
    rows = [[3.0, -5.0, -1.0, 4.0, 2.0, 1.5, 0.5, 2.0, -1.0]]
    boxes, labels = [boxes_of(rows)] * 2, [torch.tensor([2])] * 2
    feat = torch.randn(2, 4, 8, 16)
    alone = head.loss(head(feat[:1], [{}]), boxes[:1], labels[:1])
    outputs = head(torch.cat([feat[:1], 100 * torch.randn(1, 4, 8, 16)]), [{}, {'dropped_modalities': ('points', )}])
    assert outputs.trained == (True, False)
    both = head.loss(outputs, boxes, labels)
    assert all(torch.isclose(both[name], alone[name]) for name in alone)


def test_a_bad_pc_range_or_batch_is_refused():
    with pytest.raises(ValueError, match='pc_range'):
        BevAuxHead(in_channels=4, num_classes=3, pc_range=[0.0, 0.0, 0.0, -1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match='img_metas'):
        aux_head()(torch.zeros(2, 4, 8, 16), [{}])


def test_cmt_head_trains_the_bev_memory_with_it(cmt_test_data):
    default, aux = head_cfg(), head_cfg(bev_aux_config=BEV_AUX)
    extra = set(aux.state_dict()) - set(default.state_dict())
    assert extra and all(key.startswith('bev_aux_head.') for key in extra)
    bev, img = features()
    bev.requires_grad_(True)
    img_metas = cmt_test_data['make_img_metas'](2)
    preds, losses = train_losses(aux, img_metas, bev, img)
    assert preds.bev_aux.heatmap.shape == (2, 5, 5, 6)
    assert BEV_AUX_LOSSES <= set(losses) and all(torch.isfinite(losses[name]) for name in BEV_AUX_LOSSES)
    sum(losses[name] for name in BEV_AUX_LOSSES).backward()
    assert bev.grad.abs().sum() > 0
    assert aux.eval()([bev], [img], img_metas).bev_aux is None
    _, default_losses = train_losses(default, img_metas, bev, img)
    assert not BEV_AUX_LOSSES & set(default_losses)


def test_a_detached_head_trains_itself_only(cmt_test_data):
    aux = head_cfg(bev_aux_config=dict(BEV_AUX, detach_input=True))
    bev, img = features()
    bev.requires_grad_(True)
    preds, losses = train_losses(aux, cmt_test_data['make_img_metas'](2), bev, img)
    sum(losses[name] for name in BEV_AUX_LOSSES).backward()
    assert bev.grad is None or bev.grad.abs().sum() == 0, 'the aux losses must not reach the BEV features'
    assert aux.bev_aux_head.stem.conv.weight.grad.abs().sum() > 0


def test_regression_at_reads_the_maps_at_each_centre():
    head = aux_head()
    outputs = head(torch.zeros(2, 4, 8, 16), [{}, {}])
    outputs.regression = torch.zeros(2, 4, 8, 16)
    outputs.regression[1, :, 1, 9] = torch.tensor([math.sin(2.5), math.cos(2.5), 3.0, -1.0])  # the cell of (3, -5) m
    outputs.regression[1, 0, 6, 2] = -1.0  # the cell of (-11, 5) m: yaw -pi/2, standing
    fields = head.regression_at(outputs, [torch.zeros(0, 2), torch.tensor([[3.0, -5.0, 9.0], [-11.0, 5.0, 9.0]])])
    assert fields[0].shape == (0, 3)
    torch.testing.assert_close(fields[1], torch.tensor([[2.5, 3.0, -1.0], [-math.pi / 2, 0.0, 0.0]]))


@pytest.mark.parametrize('heading, velocity', [(True, False), (False, True), (True, True)])
def test_boxes_take_the_maps_fields_at_inference_where_the_fused_pass_decoded(cmt_test_data, heading, velocity):
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    plain = head_cfg(bev_aux_config=BEV_AUX).eval()
    aux = head_cfg(bev_aux_config=dict(BEV_AUX, heading_at_inference=heading, velocity_at_inference=velocity)).eval()
    aux.load_state_dict(plain.state_dict())
    with torch.no_grad():
        outputs = aux([bev], [img], img_metas)
        assert outputs.bev_aux is not None and outputs.bev_aux.trained == (True, True)
        outputs.bev_aux.regression[:] = torch.tensor([1.0, 0.0, 2.0, -3.0])[:, None, None]  # yaw pi/2, (2, -3) m/s
        outputs = dataclasses.replace(outputs, bev_aux=dataclasses.replace(outputs.bev_aux, trained=(True, False)))
        boxes = aux.get_bboxes(outputs, img_metas)
        reference = plain.get_bboxes(plain([bev], [img], img_metas), img_metas)
    expected = reference[0][0].tensor.clone()
    if heading:
        expected[:, 6] = math.pi / 2
    if velocity:
        expected[:, 7:9] = torch.tensor([2.0, -3.0])
    torch.testing.assert_close(boxes[0][0].tensor, expected)
    torch.testing.assert_close(boxes[1][0].tensor, reference[1][0].tensor)


def test_a_head_without_lidar_tokens_refuses_it():
    with pytest.raises(ValueError, match='BEV memory'):
        head_cfg(bev_aux_config=BEV_AUX, **IMAGE_HEAD)


def test_the_flat_key_is_grouped_into_aids():
    model = upgrade_model_config(dict(type='CmtDetector', pts_bbox_head=dict(type='CmtHead', bev_aux_config=BEV_AUX)))
    assert model['pts_bbox_head']['aids'] == dict(bev_aux_config=BEV_AUX)
    assert gts()  # the shared fixtures stay importable
