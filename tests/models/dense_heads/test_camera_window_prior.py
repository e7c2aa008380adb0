"""CmtImageHead's camera_window_prior: AQR's local camera bias with a constant amplitude, without a router."""
import math

import numpy as np
import pytest
import torch
from test_cmt_head import PC_RANGE, features, head_cfg
from test_image_aux_head import IMAGE_HEAD, gts

from projects.mmdet3d_plugin.models.aqr.bias_generator import AttentionBiasGenerator
from projects.mmdet3d_plugin.models.aqr.projection import project_reference_points
from projects.mmdet3d_plugin.models.dense_heads.camera_window_prior import CameraWindowPrior
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry

PRIOR = dict(window_size=5, bias=4.0)
# two views of a 64 x 96 image, feature maps 8 x 12 (stride 8); the camera looks along +x (view 1) or -x (view 0):
# (u * d, v * d, d) = (48 x - 8 y, 32 x - 8 z, x) for view 1
F, CX, CY = 8.0, 48.0, 32.0
FRONT = np.array([[CX, -F, 0, 0], [CY, 0, -F, 0], [1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float64)
BACK = np.array([[-CX, F, 0, 0], [-CY, 0, -F, 0], [-1, 0, 0, 0], [0, 0, 0, 1]], dtype=np.float64)
CAMERA_SHAPE = (2, 8, 12)
META = dict(lidar2img=[BACK, FRONT], img_shape=[(64, 96, 3)] * 2, pad_shape=[(64, 96, 3)] * 2)
GEOMETRY = CameraGeometry.from_metas([META])


def normalised(points):
    """Metric LiDAR points ``[bs, Q, 3]`` -> normalised in PC_RANGE."""
    low, high = torch.tensor(PC_RANGE[:3]), torch.tensor(PC_RANGE[3:])
    return (torch.tensor(points) - low) / (high - low)


def recording_transformer(head):
    """Make ``head`` record the cross_attn_bias its transformer gets."""
    biases, run = [], head.transformer.forward

    def record(*args, **kwargs):
        biases.append(kwargs['cross_attn_bias'])
        return run(*args, **kwargs)

    head.transformer.forward = record
    return biases


def test_default_adds_no_bias_and_no_parameters_and_leaves_outputs_unchanged(cmt_test_data):
    _, img = features()
    img_metas = cmt_test_data['make_img_metas'](2)
    outputs = []
    for options in (dict(), dict(camera_window_prior=None), dict(camera_window_prior=PRIOR)):
        torch.manual_seed(0)
        head = head_cfg(**IMAGE_HEAD, **options).eval()
        biases = recording_transformer(head)
        outputs.append(head([None], [img], img_metas)[0][0]['cls_logits'])
        assert (biases[0] is None) == (options.get('camera_window_prior') is None)
        assert set(head.state_dict()) == set(head_cfg(**IMAGE_HEAD).state_dict())
    assert torch.equal(outputs[0], outputs[1])
    assert not torch.allclose(outputs[0], outputs[2]), 'the prior changes the outputs'


def test_bias_is_the_decaying_window_around_the_projected_cell_and_zero_elsewhere():
    # (4, 0, 0) -> view 1 pixel (48, 32) -> cell (4, 6); (-2, 4, 0) -> view 0 pixel (64, 32) -> cell (4, 8);
    # (0, 5, 0) has depth 0 in both views: visible in none
    ref = normalised([[[4.0, 0.0, 0.0], [-2.0, 4.0, 0.0], [0.0, 5.0, 0.0]]])
    bias = CameraWindowPrior(**PRIOR)(ref, PC_RANGE, CAMERA_SHAPE, GEOMETRY)
    assert bias.num_keys == 2 * 8 * 12
    dense = bias.to_dense()[0, 0].view(3, 2, 8, 12)  # [Q, view, h, w]
    for query, (view, row, col) in enumerate([(1, 4, 6), (0, 4, 8)]):
        expected = torch.zeros(2, 8, 12)
        for dy in range(-2, 3):
            for dx in range(-2, 3):
                expected[view, row + dy, col + dx] = 4.0 * max(0.0, 1.0 - math.hypot(dy, dx) / 2.5)
        torch.testing.assert_close(dense[query], expected)
        assert dense[query, view, row, col] == 4.0
    assert (dense[2] == 0).all(), 'a query visible in no view gets no bias'


def test_window_is_clipped_at_the_border_of_the_view():
    # (2, 11.5, 0) -> view 1 pixel (48 - 46, 32) = (2, 32) -> cell (4, 0); behind view 0
    ref = normalised([[[2.0, 11.5, 0.0]]])
    dense = CameraWindowPrior(**PRIOR)(ref, PC_RANGE, CAMERA_SHAPE, GEOMETRY).to_dense()[0, 0, 0].view(2, 8, 12)
    assert dense[0].abs().sum() == 0
    torch.testing.assert_close(dense[1, 4, :3], torch.tensor([4.0, 2.4, 0.8]))
    assert dense[1].count_nonzero() == 13, 'the 21 cells of the decaying window minus the 8 left of column 0'


def test_prior_equals_the_camera_part_of_aqr_local_bias_for_a_constant_weight():
    """camera weight 0.9, bias_scale 5: (0.9 - 0.5) * 2 * 5 = 4, the same window, the same keys."""
    ref = normalised([[[4.0, 0.0, 0.0], [-2.0, 4.0, 0.0], [0.0, 5.0, 0.0], [3.0, -1.0, 1.0]]])
    bev_shape, num_bev = (6, 5), 30
    info = project_reference_points(ref, PC_RANGE, bev_shape, CAMERA_SHAPE, GEOMETRY)
    weights = torch.full((1, 4), 0.9)
    generator = AttentionBiasGenerator(window_size=5, bias_scale=5.0, learnable_scale=False)
    aqr = generator(weights, weights, info, bev_shape, CAMERA_SHAPE).restrict_keys(num_bev, num_bev + 2 * 8 * 12)
    prior = CameraWindowPrior(**PRIOR)(ref, PC_RANGE, CAMERA_SHAPE, GEOMETRY)
    assert prior.to_dense().abs().sum() > 0
    torch.testing.assert_close(prior.to_dense(), aqr.to_dense())


@pytest.mark.parametrize('backend', ['math', 'auto'])
def test_attention_applies_the_structured_bias_exactly(backend, cmt_test_data):
    """The decoder's output with the prior's structured bias equals the one with its dense tensor."""
    torch.manual_seed(0)
    head = head_cfg(**IMAGE_HEAD, camera_window_prior=PRIOR).eval()
    for layer in head.transformer.decoder.layers:
        layer.attentions[1].attn.backend = backend
    _, img = features()
    geometry = CameraGeometry.from_metas(cmt_test_data['make_img_metas'](2))
    reference_points = head.reference_points.weight[None].expand(2, -1, -1)
    query_embed = head.positions.queries(reference_points, geometry)
    rv_pos = head.positions.frustum(img, geometry)
    bias = head.camera_aids.window_prior_bias(reference_points, img, geometry)()
    assert bias.num_keys == 2 * 4 * 10 and bias.to_dense().abs().sum() > 0
    structured, dense, unbiased = (head.transformer(None, img, query_embed, None, rv_pos, cross_attn_bias=cross)[0]
                                   for cross in (bias, bias.to_dense(), None))
    torch.testing.assert_close(structured, dense, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(structured, unbiased)


def test_head_with_the_prior_trains_and_runs_at_test_time(cmt_test_data):
    head = head_cfg(**IMAGE_HEAD, camera_window_prior=PRIOR)
    biases = recording_transformer(head)
    _, img = features()
    img.requires_grad_(True)
    img_metas = cmt_test_data['make_img_metas'](2)
    boxes, labels = gts()
    preds = head.train()([None], [img], img_metas, boxes, labels)
    pad_size = preds.dn_queries.pad_size
    assert biases[-1].num_queries == pad_size + head.num_query, 'DN queries get the prior too'
    assert biases[-1].to_dense()[:, :, :pad_size].abs().sum() > 0
    losses = head.loss(boxes, labels, preds)
    assert all(torch.isfinite(value) for value in losses.values())
    sum(losses.values()).backward()
    assert img.grad.abs().sum() > 0 and head.rv_embedding[0].weight.grad.abs().sum() > 0
    head.eval()
    with torch.no_grad():
        results = head.get_bboxes(head([None], [img], img_metas), img_metas)
    assert biases[-1].num_queries == head.num_query
    assert len(results) == 2 and all(torch.isfinite(scores).all() for _, scores, _ in results)


def test_bad_prior_options_raise():
    with pytest.raises(ValueError, match='window_size'):
        head_cfg(**IMAGE_HEAD, camera_window_prior=dict(window_size=4, bias=4.0))
    with pytest.raises(TypeError):
        head_cfg(**IMAGE_HEAD, camera_window_prior=dict(window=5))
