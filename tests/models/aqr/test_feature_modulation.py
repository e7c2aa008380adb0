"""FeatureModulation (legacy ablation): the routing weights rendered into maps that scale the features; no bias."""
import torch

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.aqr import project_reference_points
from projects.mmdet3d_plugin.models.aqr.feature_modulation import FeatureModulation
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry

PC_RANGE = [-10.0, -10.0, -5.0, 10.0, 10.0, 3.0]


def routing_inputs(rig):
    meta = rig['meta']([rig['front'](), rig['back']()])
    reference_points = torch.tensor(rig['normalise']([[[4.0, 0.0, 0.0], [-3.0, 1.0, 0.5], [0.0, 8.0, 0.0]]]),
                                    dtype=torch.float32)
    info = project_reference_points(reference_points, PC_RANGE, (4, 5), (2, 4, 6), CameraGeometry.from_metas([meta]))
    weights = torch.tensor([[0.9, 0.2, 0.6]])
    return weights, 1 - weights, info, torch.randn(1, 8, 4, 5), torch.randn(2, 8, 4, 6)


def test_feature_modulation_scales_the_features_by_the_rendered_weights(rig):
    lidar, camera, info, bev, img = routing_inputs(rig)
    legacy = FeatureModulation(dict(type='WeightRenderer', kernel='window', window_size=3, background=1.0),
                               dict(type='FeatureModulator', residual_ratio=0.0))
    assert list(legacy.modules) == ['weight_renderer', 'feature_modulator']
    bev_feat, img_feat = legacy(lidar, camera, info, bev, img, (4, 5), (2, 4, 6))
    bev_map, camera_map = legacy.weight_renderer(lidar, camera, info, (4, 5), (2, 4, 6))
    torch.testing.assert_close(bev_feat, bev * bev_map[:, None])
    torch.testing.assert_close(img_feat, img * camera_map.flatten(0, 1)[:, None])
    assert not torch.allclose(bev_feat, bev), 'the weights changed the features'
