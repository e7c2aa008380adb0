"""Legacy AQR (ablation): WeightRenderer splats and FeatureModulator scaling."""
import math

import pytest
import torch

from projects.mmdet3d_plugin.models.aqr import FeatureModulator, WeightRenderer


def test_window_splat_is_the_mean_of_the_weights_that_reach_a_cell():
    renderer = WeightRenderer(kernel='window', window_size=3, background=1.0)
    weights = torch.tensor([[0.2, 0.8]])
    pts_bev = torch.tensor([[[1, 1], [1, 2]]])
    bev = renderer.render_bev(weights, pts_bev, (4, 5))
    assert bev.shape == (1, 4, 5)
    assert torch.isclose(bev[0, 1, 1], torch.tensor(0.5))  # both windows cover (1, 1)
    assert torch.isclose(bev[0, 0, 0], torch.tensor(0.2))  # only the first one
    assert torch.isclose(bev[0, 0, 3], torch.tensor(0.8))  # only the second one
    assert torch.isclose(bev[0, 3, 4], torch.tensor(1.0))  # nobody: background


def test_gaussian_splat_weights_by_distance_and_invisible_queries_leave_camera_maps():
    renderer = WeightRenderer(kernel='gaussian', window_size=3, sigma=1.0, background=0.5)
    weights = torch.tensor([[0.0, 1.0, 0.9]], requires_grad=True)
    pers = torch.tensor([[[0, 0, 0], [0, 0, 1], [-1, -1, -1]]])
    visible = torch.tensor([[True, True, False]])
    camera = renderer.render_camera(weights, pers, visible, (2, 3, 3))
    assert camera.shape == (1, 2, 3, 3)
    # cell (0, 0, 0): query 0 at distance 0 (k=1), query 1 at distance 1 (k=e^-0.5)
    expected = math.exp(-0.5) / (1 + math.exp(-0.5))
    assert torch.isclose(camera[0, 0, 0, 0], torch.tensor(expected, dtype=camera.dtype), atol=1e-6)
    assert torch.all(camera[0, 1] == 0.5), 'view 1 is reached by nobody (query 2 is invisible)'
    camera.sum().backward()
    assert weights.grad[0, 2] == 0 and weights.grad[0, 1] > 0


def test_feature_modulator_formula_and_shape_errors():
    modulator = FeatureModulator(residual_ratio=0.25)
    features = torch.ones(2, 3, 4, 5)
    weights = torch.full((2, 4, 5), 0.5)
    out = modulator(features, weights)
    assert torch.allclose(out, torch.full_like(out, 0.5 * 0.75 + 0.25))
    camera = modulator(torch.ones(2 * 3, 3, 4, 5), torch.zeros(2, 3, 4, 5))
    assert torch.allclose(camera, torch.full_like(camera, 0.25))
    with pytest.raises(ValueError, match='does not match'):
        modulator(features, torch.ones(2, 5, 4))
    with pytest.raises(ValueError, match='residual_ratio'):
        FeatureModulator(residual_ratio=1.5)
