"""CameraAids: the aux head, depth-aware camera positions, the camera window prior and black views for the fused
pass (all off by default)."""
import pytest
import torch

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention import AttentionBias
from projects.mmdet3d_plugin.models.dense_heads.camera_aids import CameraAids
from projects.mmdet3d_plugin.models.dense_heads.pass_plan import DecoderMemory, PassPlan
from projects.mmdet3d_plugin.models.utils.camera_blanking import FusedBlankViews
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry
from test_cmt_head import C, PC_RANGE, features, head_cfg

CAMERA_PASS = PassPlan(modality_passes=('fused', 'camera'))


def aids(pass_plan=CAMERA_PASS, **options):
    return CameraAids(**options, hidden_dim=C, num_classes=5, pass_plan=pass_plan, pc_range=PC_RANGE)


def test_defaults_add_nothing_and_every_pass_sees_the_same_cameras(cmt_test_data):
    default = aids(PassPlan())
    assert default.modules == dict(image_aux_head=None, camera_window_prior=None)
    assert default.draw_fused_image_drops([dict()] * 3) == (False, ) * 3
    _, img = features()
    metas = cmt_test_data['make_img_metas'](2)
    geometry = CameraGeometry.from_metas(metas)
    positions = head_cfg().positions
    cameras = default.cameras(img, metas, geometry, None, positions, training=True)
    assert cameras.fused_img_feat is cameras.img_feat is img and cameras.fused_rv_pos is cameras.rv_pos
    torch.testing.assert_close(cameras.rv_pos, positions.frustum(img, geometry), rtol=0, atol=0)
    assert cameras.image_aux is None and cameras.fused_metas is metas
    fused = DecoderMemory(None, None, img, cameras.rv_pos)
    assert cameras.single_modality(fused) is fused
    assert default.window_prior_bias(torch.rand(2, 3, 3), img, geometry) is None
    assert default.loss(None, None, [], [], img.device) == {}
    assert default.cameras(None, metas, None, None, positions, True).img_feat is None


def test_black_views_reach_the_fused_pass_only(cmt_test_data):
    black_aids = aids(fused_image_drop_prob=0.5)
    _, img = features()
    metas = cmt_test_data['make_img_metas'](2)
    black = torch.randn(2, *img.shape[1:])
    cameras = black_aids.cameras(img, metas, CameraGeometry.from_metas(metas), FusedBlankViews((False, True), black),
                                 head_cfg().positions, True)
    torch.testing.assert_close(cameras.fused_img_feat, torch.cat((img[:2], black)), rtol=0, atol=0)
    assert cameras.img_feat is img and cameras.fused_black_samples == (False, True)
    assert [meta.get('dropped_modalities', []) for meta in cameras.fused_metas] == [[], ['image']]
    real = cameras.single_modality(DecoderMemory(None, None, cameras.fused_img_feat, cameras.fused_rv_pos, 'bias'))
    assert real.img_feat is img and real.rv_pos is cameras.rv_pos and real.cross_attn_bias == 'bias'
    losses = black_aids.loss(None, cameras.fused_black_samples, [], [], img.device)
    assert losses['fused.num_black_camera_samples'] == 1


def test_window_prior_bias_covers_the_camera_keys_of_every_query(cmt_test_data):
    prior_aids = aids(camera_window_prior=dict(window_size=3, bias=4.0))
    assert list(prior_aids.modules) == ['image_aux_head', 'camera_window_prior']
    _, img = features()
    reference_points = torch.rand(2, 6, 3)
    bias = prior_aids.window_prior_bias(reference_points, img,
                                     CameraGeometry.from_metas(cmt_test_data['make_img_metas'](2)))()
    assert isinstance(bias, AttentionBias) and bias.num_keys == 2 * 4 * 10 and bias.num_queries == 6


def test_aux_head_outputs_in_training_and_the_depth_at_test_time(cmt_test_data):
    depth_aids = aids(image_aux_config=dict(type='ImageAuxHead', feat_channels=8), camera_depth_position=True)
    _, img = features()
    metas = cmt_test_data['make_img_metas'](2)
    geometry = CameraGeometry.from_metas(metas)
    positions = head_cfg().positions
    training = depth_aids.cameras(img, metas, geometry, None, positions, training=True)
    assert training.image_aux.heatmap.shape == (4, 5, 4, 10)
    testing = depth_aids.cameras(img, metas, geometry, None, positions, training=False)
    assert testing.image_aux is None
    assert not torch.allclose(testing.rv_pos, positions.frustum(img, geometry)), 'the depth term is added'


def test_bad_options_raise():
    with pytest.raises(ValueError, match='has no camera features'):
        aids(PassPlan(modalities=('lidar', )), image_aux_config=dict(type='ImageAuxHead'))
    with pytest.raises(ValueError, match='depth branch'):
        aids(camera_depth_position=True)
    with pytest.raises(ValueError, match="none of modality_passes \\('fused',\\) does; add 'camera'"):
        aids(PassPlan(), camera_window_prior=dict(window_size=3, bias=4.0))
    with pytest.raises(ValueError, match=r'must be in \[0, 1\)'):
        aids(fused_image_drop_prob=1.0)
    with pytest.raises(ValueError, match='this head decodes one modality'):
        aids(PassPlan(modalities=('camera', )), fused_image_drop_prob=0.5)
    with pytest.raises(ValueError, match="needs modulation='attention_bias'"):
        CameraAids(fused_image_drop_prob=0.5, hidden_dim=C, num_classes=5, pass_plan=CAMERA_PASS, pc_range=PC_RANGE,
                   modulates_features=True)
