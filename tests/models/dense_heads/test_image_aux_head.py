"""Camera learning aids of CmtHead: the ImageAuxHead losses and the depth-aware camera position (both default off)."""
import pytest
import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.dense_heads.image_aux_head import ImageAuxHead
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry
from test_cmt_head import C, features, head_cfg
from test_cmt_head_modality_passes import REFERENCE, fused_pass_outputs

AUX = dict(type='ImageAuxHead', feat_channels=16)
AUX_LOSSES = {'image_aux.loss_heatmap', 'image_aux.loss_depth'}
IMAGE_HEAD = dict(head_type='CmtImageHead', transformer_type='CmtImageTransformer')


def gts():
    """Boxes seen by the front camera (+x) and the back one (-x), with velocity."""
    rows = [[6.0, 0.0, -1.0, 2.0, 4.0, 2.0, 0.3, 1.0, 0.0], [5.0, 2.0, -0.5, 1.0, 1.0, 1.5, 0.0, 0.0, 0.0],
            [-7.0, 1.0, -1.0, 2.0, 2.0, 2.0, 1.0, 0.0, 0.5]]
    return ([LiDARInstance3DBoxes(torch.tensor(rows), box_dim=9), LiDARInstance3DBoxes(torch.tensor(rows[:2]),
                                                                                        box_dim=9)],
            [torch.tensor([0, 3, 4]), torch.tensor([1, 2])])


def train_losses(head, img_metas, bev=None, img=None):
    boxes, labels = gts()
    preds = head.train()([bev], [img], img_metas, boxes, labels)
    return preds, head.loss(boxes, labels, preds)


@pytest.mark.usefixtures('reference_threads')
def test_default_adds_no_parameters_and_leaves_outputs_unchanged(cmt_test_data):
    explicit = dict(image_aux_config=None, camera_depth_position=False)
    assert list(head_cfg().state_dict()) == list(head_cfg(**explicit).state_dict())
    expected = torch.load(REFERENCE)['cmt']
    actual = fused_pass_outputs(cmt_test_data, **explicit)
    assert set(actual) == set(expected)
    assert not [key for key, value in expected.items() if cmt_test_data['differs_from_reference'](actual[key], value)]


def test_aux_head_adds_only_its_own_keys_and_runs_in_training_only(cmt_test_data):
    default, aux = head_cfg(), head_cfg(image_aux_config=AUX)
    extra = set(aux.state_dict()) - set(default.state_dict())
    assert extra and all(key.startswith('image_aux_head.') for key in extra)
    assert set(default.state_dict()) <= set(aux.state_dict())
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    preds, _ = train_losses(aux, img_metas, bev, img)
    outputs = preds.image_aux
    assert outputs.heatmap.shape == (4, 5, 4, 10) and outputs.depth.shape == (4, 1, 4, 10)
    assert (outputs.depth > 0).all()
    assert aux.eval()([bev], [img], img_metas).image_aux is None


@pytest.mark.parametrize('options', [dict(), IMAGE_HEAD, dict(modality_passes=('fused', 'lidar', 'camera'))],
                         ids=['fusion', 'camera_only', 'modality_passes'])
def test_aux_losses_are_finite_and_train_the_image_features(options, cmt_test_data):
    head = head_cfg(image_aux_config=AUX, **options)
    bev, img = features()
    img.requires_grad_(True)
    bev = None if options.get('head_type') == 'CmtImageHead' else bev
    _, losses = train_losses(head, cmt_test_data['make_img_metas'](2), bev, img)
    assert AUX_LOSSES <= set(losses)
    assert all(torch.isfinite(losses[key]) and losses[key] > 0 for key in AUX_LOSSES)
    if 'modality_passes' in options:
        assert {'lidar.loss_cls', 'camera.loss_cls'} <= set(losses)
    (losses['image_aux.loss_heatmap'] + losses['image_aux.loss_depth']).backward()
    assert img.grad.abs().sum() > 0
    assert head.image_aux_head.depth.weight.grad.abs().sum() > 0
    assert head.image_aux_head.heatmap.weight.grad.abs().sum() > 0


def test_samples_with_dropped_images_get_no_aux_loss(cmt_test_data):
    head = head_cfg(image_aux_config=AUX)
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    img_metas[1]['dropped_modalities'] = ('image', )
    preds, losses = train_losses(head, img_metas, bev, img)
    outputs = preds.image_aux
    grads = torch.autograd.grad(losses['image_aux.loss_heatmap'] + losses['image_aux.loss_depth'],
                                [outputs.heatmap, outputs.log_depth])
    for grad in grads:  # views 0, 1 are sample 0; views 2, 3 the dropped sample 1
        assert grad[:2].abs().sum() > 0 and grad[2:].abs().sum() == 0
    for meta in img_metas:
        meta['dropped_modalities'] = ('image', )
    _, losses = train_losses(head, img_metas, bev, img)
    assert all(losses[key] == 0 for key in AUX_LOSSES)


def test_bad_aux_options_raise():
    with pytest.raises(ValueError, match='image_aux_config'):
        head_cfg(camera_depth_position=True)
    with pytest.raises(ValueError, match='depth branch'):
        head_cfg(image_aux_config=dict(AUX, loss_depth=None), camera_depth_position=True)
    with pytest.raises(ValueError, match='camera'):
        head_cfg('CmtLidarHead', 'CmtLidarTransformer', image_aux_config=AUX)


def test_camera_depth_position_lifts_the_tokens_at_the_predicted_depth(cmt_test_data, monkeypatch):
    head = head_cfg(image_aux_config=AUX, camera_depth_position=True).eval()
    assert set(head.state_dict()) == set(head_cfg(image_aux_config=AUX).state_dict()), 'no new parameters'
    bev, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    depths = []
    token_depth = head.positions.token_depth
    monkeypatch.setattr(head.positions, 'token_depth', lambda depth, geometry: depths.append(depth) or
                        token_depth(depth, geometry))
    with torch.no_grad():
        head([bev], [img], img_metas)
        expected = head.image_aux_head(img, img_metas, CameraGeometry.from_metas(img_metas)).depth[:, 0]
    assert len(depths) == 1
    torch.testing.assert_close(depths[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize('options', [dict(), IMAGE_HEAD], ids=['fusion', 'camera_only'])
def test_predicted_depth_changes_outputs_at_test_time(options, cmt_test_data):
    head = head_cfg(image_aux_config=AUX, camera_depth_position=True, **options).eval()
    bev, img = features()
    bev = None if options else bev
    img_metas = cmt_test_data['make_img_metas'](2)
    before = head([bev], [img], img_metas)[0][0]['center']
    with torch.no_grad():
        head.image_aux_head.depth.bias.add_(1.0)
    after = head([bev], [img], img_metas)[0][0]['center']
    assert not torch.allclose(before, after)


def test_detection_loss_does_not_train_the_depth_branch_through_the_position(cmt_test_data):
    head = head_cfg(image_aux_config=AUX, camera_depth_position=True, modality_passes=('fused', 'camera'))
    bev, img = features()
    _, losses = train_losses(head, cmt_test_data['make_img_metas'](2), bev, img)
    sum(value for key, value in losses.items() if key not in AUX_LOSSES).backward()
    assert head.bev_embedding[0].weight.grad.abs().sum() > 0
    for parameter in head.image_aux_head.parameters():
        assert parameter.grad is None or parameter.grad.abs().sum() == 0


def test_aux_head_alone_fits_a_batch(cmt_test_data):
    """Sanity: a few Adam steps on fixed features bring both aux losses well down."""
    torch.manual_seed(0)
    boxes, labels = gts()
    img_metas = cmt_test_data['make_img_metas'](2)
    geometry = CameraGeometry.from_metas(img_metas)
    aux = ImageAuxHead(in_channels=C, num_classes=5, feat_channels=16)
    aux.init_weights()
    feat = torch.randn(4, C, 4, 10)
    optimizer = torch.optim.Adam(aux.parameters(), lr=0.02)
    first = None
    for _ in range(60):
        losses = aux.loss(aux(feat, img_metas, geometry), boxes, labels)
        first = first or {key: value.item() for key, value in losses.items()}
        optimizer.zero_grad()
        sum(losses.values()).backward()
        optimizer.step()
    assert all(losses[key].item() < 0.5 * first[key] for key in first)
