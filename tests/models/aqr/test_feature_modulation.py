"""How the routing weights reach the decoder: BiasModulation (the scheme) and FeatureModulation (legacy ablation)."""
import torch

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention.per_layer import PerLayer
from projects.mmdet3d_plugin.models.aqr import AttentionBiasGenerator, project_reference_points
from projects.mmdet3d_plugin.models.aqr.feature_modulation import BiasModulation, FeatureModulation

PC_RANGE = [-10.0, -10.0, -5.0, 10.0, 10.0, 3.0]


def routing_inputs(rig):
    meta = rig['meta']([rig['front'](), rig['back']()])
    reference_points = torch.tensor(rig['normalise']([[[4.0, 0.0, 0.0], [-3.0, 1.0, 0.5], [0.0, 8.0, 0.0]]]),
                                    dtype=torch.float32)
    info = project_reference_points(reference_points, PC_RANGE, (4, 5), (2, 4, 6), [meta])
    weights = torch.tensor([[0.9, 0.2, 0.6]])
    return weights, 1 - weights, info, torch.randn(1, 8, 4, 5), torch.randn(2, 8, 4, 6)


def test_bias_modulation_leaves_the_features_and_gives_one_bias_per_layer_when_asked(rig):
    lidar, camera, info, bev, img = routing_inputs(rig)
    shared = BiasModulation(AttentionBiasGenerator(window_size=3, bias_scale=2.0))
    assert list(shared.modules) == ['attention_bias_generator']
    memory = shared(lidar, camera, info, bev, img, num_dn=2)
    assert memory.bev_feat is bev and memory.img_feat is img
    dense = memory.cross_attn_bias.to_dense()
    assert dense.shape[-2:] == (2 + 3, 20 + 48) and (dense[..., :2, :] == 0).all()
    per_layer = BiasModulation(AttentionBiasGenerator(window_size=3, per_layer=True, num_layers=3))
    assert isinstance(per_layer(lidar, camera, info, bev, img, num_dn=0).cross_attn_bias, PerLayer)


def test_feature_modulation_scales_the_features_by_the_rendered_weights_and_gives_no_bias(rig):
    lidar, camera, info, bev, img = routing_inputs(rig)
    legacy = FeatureModulation(dict(type='WeightRenderer', kernel='window', window_size=3, background=1.0),
                               dict(type='FeatureModulator', residual_ratio=0.0))
    assert list(legacy.modules) == ['attention_bias_generator', 'weight_renderer', 'feature_modulator']
    assert legacy.modules['attention_bias_generator'] is None
    memory = legacy(lidar, camera, info, bev, img, num_dn=2)
    assert memory.cross_attn_bias is None
    bev_map, camera_map = legacy.weight_renderer(lidar, camera, info, (4, 5), (2, 4, 6))
    torch.testing.assert_close(memory.bev_feat, bev * bev_map[:, None])
    torch.testing.assert_close(memory.img_feat, img * camera_map.flatten(0, 1)[:, None])
    assert not torch.allclose(memory.bev_feat, bev), 'the weights changed the features'
