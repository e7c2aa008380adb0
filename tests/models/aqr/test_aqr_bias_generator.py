"""AttentionBiasGenerator: weights -> structured cross-attention bias, checked against direct loops."""
import math

import pytest
import torch

from projects.mmdet3d_plugin.attention import AttentionBias, PerLayer, SegmentBias, WindowBias, apply_attention
from projects.mmdet3d_plugin.models.aqr import AttentionBiasGenerator, weights_to_bias

BEV_SHAPE = (6, 7)
CAMERA_SHAPE = (3, 4, 5)
NUM_BEV = BEV_SHAPE[0] * BEV_SHAPE[1]
NUM_KEYS = NUM_BEV + CAMERA_SHAPE[0] * CAMERA_SHAPE[1] * CAMERA_SHAPE[2]


def _projection(bs, num_queries, generator=None):
    gen = generator or torch.Generator().manual_seed(1)
    pts_bev = torch.stack([torch.randint(0, BEV_SHAPE[0], (bs, num_queries), generator=gen),
                           torch.randint(0, BEV_SHAPE[1], (bs, num_queries), generator=gen)], -1)
    pers = torch.stack([torch.randint(0, CAMERA_SHAPE[0], (bs, num_queries), generator=gen),
                        torch.randint(0, CAMERA_SHAPE[1], (bs, num_queries), generator=gen),
                        torch.randint(0, CAMERA_SHAPE[2], (bs, num_queries), generator=gen)], -1)
    visible = torch.rand(bs, num_queries, generator=gen) > 0.3
    visible[0, 0] = False
    pers = torch.where(visible[..., None], pers, torch.full_like(pers, -1))
    # a query at a grid corner so its windows are clipped
    pts_bev[0, 1] = torch.tensor([0, BEV_SHAPE[1] - 1])
    return dict(pts_bev=pts_bev, pts_idx=pts_bev[..., 0] * BEV_SHAPE[1] + pts_bev[..., 1], pts_pers_idx=pers,
                visible=visible)


def _loop_local_bias(lidar_bias, camera_bias, info, window_size, num_dn):
    """The local bias written as the design card states it, one key at a time."""
    bs, num_queries = lidar_bias.shape
    dense = torch.zeros(bs, num_dn + num_queries, NUM_KEYS, dtype=torch.float64)
    half, radius = window_size / 2.0, window_size // 2
    for b in range(bs):
        for q in range(num_queries):
            row = num_dn + q
            cy, cx = info['pts_bev'][b, q].tolist()
            for y in range(BEV_SHAPE[0]):
                for x in range(BEV_SHAPE[1]):
                    if abs(y - cy) <= radius and abs(x - cx) <= radius:
                        decay = max(0.0, 1 - math.hypot(y - cy, x - cx) / half)
                        dense[b, row, y * BEV_SHAPE[1] + x] = float(lidar_bias[b, q]) * decay
            if not info['visible'][b, q]:
                continue
            view, ch, cw = info['pts_pers_idx'][b, q].tolist()
            for y in range(CAMERA_SHAPE[1]):
                for x in range(CAMERA_SHAPE[2]):
                    if abs(y - ch) <= radius and abs(x - cw) <= radius:
                        decay = max(0.0, 1 - math.hypot(y - ch, x - cw) / half)
                        key = NUM_BEV + (view * CAMERA_SHAPE[1] + y) * CAMERA_SHAPE[2] + x
                        dense[b, row, key] = float(camera_bias[b, q]) * decay
    return dense


def test_weights_to_bias_is_the_design_card_mapping():
    weights = torch.tensor([0.0, 0.25, 0.5, 1.0])
    assert torch.allclose(weights_to_bias(weights, 2.0), torch.tensor([-2.0, -1.0, 0.0, 2.0]))


@pytest.mark.parametrize('num_dn', [0, 4])
def test_global_bias_is_one_value_per_query_and_modality(num_dn):
    bs, num_queries = 2, 5
    lidar, camera = torch.rand(bs, num_queries), torch.rand(bs, num_queries)
    generator = AttentionBiasGenerator(use_local_bias=False, bias_scale=1.5)
    bias = generator(lidar, camera, _projection(bs, num_queries), BEV_SHAPE, CAMERA_SHAPE, num_dn_queries=num_dn)
    assert isinstance(bias, AttentionBias) and isinstance(bias.parts[0], SegmentBias)
    dense = bias.to_dense()[:, 0]
    assert dense.shape == (bs, num_dn + num_queries, NUM_KEYS)
    assert torch.all(dense[:, :num_dn] == 0), 'DN queries get zero bias'
    expected_lidar = (lidar - 0.5) * 2 * 1.5
    expected_camera = (camera - 0.5) * 2 * 1.5
    assert torch.allclose(dense[:, num_dn:, :NUM_BEV], expected_lidar[..., None].expand(-1, -1, NUM_BEV))
    assert torch.allclose(dense[:, num_dn:, NUM_BEV:],
                          expected_camera[..., None].expand(-1, -1, NUM_KEYS - NUM_BEV))


@pytest.mark.parametrize('window_size,num_dn', [(3, 0), (5, 2)])
def test_local_bias_matches_a_direct_loop(window_size, num_dn):
    bs, num_queries = 2, 6
    info = _projection(bs, num_queries)
    lidar, camera = torch.rand(bs, num_queries), torch.rand(bs, num_queries)
    generator = AttentionBiasGenerator(window_size=window_size, bias_scale=0.7, use_local_bias=True)
    bias = generator(lidar, camera, info, BEV_SHAPE, CAMERA_SHAPE, num_dn_queries=num_dn)
    assert isinstance(bias.parts[0], WindowBias)
    expected = _loop_local_bias(weights_to_bias(lidar, 0.7), weights_to_bias(camera, 0.7), info, window_size, num_dn)
    assert torch.allclose(bias.to_dense()[:, 0].double(), expected, atol=1e-6)
    invisible = ~info['visible'][0, 0]
    assert invisible and torch.all(bias.to_dense()[0, 0, num_dn, NUM_BEV:] == 0), 'invisible query: no camera bias'


def test_zero_scale_gives_zero_bias_and_gradients_reach_scale_and_weights():
    bs, num_queries = 1, 4
    lidar = torch.rand(bs, num_queries, requires_grad=True)
    camera = torch.rand(bs, num_queries, requires_grad=True)
    generator = AttentionBiasGenerator(window_size=3, bias_scale=0.0)
    bias = generator(lidar, camera, _projection(bs, num_queries), BEV_SHAPE, CAMERA_SHAPE)
    dense = bias.to_dense()
    assert torch.all(dense == 0)
    (dense * torch.randn_like(dense)).sum().backward()
    assert generator.bias_scale.grad is not None and generator.bias_scale.grad.abs().sum() > 0
    generator = AttentionBiasGenerator(window_size=3, bias_scale=1.0)
    generator(lidar, camera, _projection(bs, num_queries), BEV_SHAPE, CAMERA_SHAPE).to_dense().sum().backward()
    assert lidar.grad.abs().sum() > 0 and camera.grad.abs().sum() > 0


def test_bias_reaches_attention_probabilities_through_apply_attention():
    """A strongly negative camera bias removes the camera keys from the attention."""
    bs, heads, num_queries, dim = 1, 2, 3, 8
    info = _projection(bs, num_queries)
    generator = AttentionBiasGenerator(use_local_bias=False, bias_scale=50.0, learnable_scale=False)
    bias = generator(torch.ones(bs, num_queries), torch.zeros(bs, num_queries), info, BEV_SHAPE, CAMERA_SHAPE)
    q = torch.randn(bs, heads, num_queries, dim)
    k = torch.randn(bs, heads, NUM_KEYS, dim)
    v = torch.zeros(bs, heads, NUM_KEYS, dim)
    v[:, :, NUM_BEV:] = 1.0  # camera values are 1, BEV values 0: the output is the camera attention mass
    out = apply_attention(q, k, v, bias=bias, backend='math')
    assert out.abs().max() < 1e-6


def test_options_per_head_per_layer_learned_mapping_and_fp16():
    bs, num_queries = 2, 3
    lidar, camera = torch.rand(bs, num_queries), torch.rand(bs, num_queries)
    info = _projection(bs, num_queries)
    generator = AttentionBiasGenerator(use_local_bias=False, per_head=True, num_heads=4, per_layer=True,
                                       num_layers=3, learned_mapping=True)
    biases = generator(lidar, camera, info, BEV_SHAPE, CAMERA_SHAPE)
    assert isinstance(biases, PerLayer) and len(biases) == 3
    assert all(b.num_heads == 4 for b in biases)
    # learned mapping starts equal to the linear mapping, so every head and layer agrees at init
    assert torch.allclose(biases[0].to_dense()[:, 0, :, 0], weights_to_bias(lidar, 1.0))
    with torch.no_grad():
        generator.bias_scale[1] = 2.0
        generator.head_scale[3] = -1.0
    dense = generator(lidar, camera, info, BEV_SHAPE, CAMERA_SHAPE)[1].to_dense()
    assert torch.allclose(dense[:, 3, :, 0], -2.0 * weights_to_bias(lidar, 1.0))
    half = AttentionBiasGenerator(use_local_bias=False, fp16=True)
    assert half(lidar, camera, info, BEV_SHAPE, CAMERA_SHAPE,
                feature_dtype=torch.float16).parts[0].values.dtype == torch.float16
    assert half(lidar, camera, info, BEV_SHAPE, CAMERA_SHAPE).parts[0].values.dtype == torch.float32


def test_bad_inputs_raise_clear_errors():
    generator = AttentionBiasGenerator()
    info = _projection(1, 3)
    with pytest.raises(ValueError, match='lidar_weights and camera_weights'):
        generator(torch.rand(1, 3), torch.rand(1, 4), info, BEV_SHAPE, CAMERA_SHAPE)
    with pytest.raises(KeyError, match='visible'):
        generator(torch.rand(1, 3), torch.rand(1, 3), {k: v for k, v in info.items() if k != 'visible'},
                  BEV_SHAPE, CAMERA_SHAPE)
    with pytest.raises(ValueError, match='pts_bev'):
        generator(torch.rand(1, 2), torch.rand(1, 2), info, BEV_SHAPE, CAMERA_SHAPE)
    with pytest.raises(ValueError, match='odd'):
        AttentionBiasGenerator(window_size=4)


def test_a_float64_generator_builds_its_bias_in_float64():
    """check_gpu's float64 reference of alpha's gradient: no float32 rounding inside a float64 generator."""
    generator = AttentionBiasGenerator(bias_scale=1.0 / 3.0).double()
    weights = torch.full((1, 4), 0.3, dtype=torch.float64)
    bias = generator.modality_biases(weights, weights)
    assert bias.dtype == torch.float64
    expected = weights_to_bias(weights[..., None].expand(1, 4, 2), generator.bias_scale.detach())
    assert torch.allclose(bias, expected[None, :, None], rtol=0, atol=1e-15)


@pytest.mark.parametrize('num_dn', [0, 3])
def test_mute_term_lowers_every_key_of_a_routed_away_modality(num_dn):
    """``mute_scale``: the local windows plus ``-beta * (1 - w)`` on all keys of each modality; DN queries none;
    beta learns; a weight of 0 takes the modality out of the attention."""
    bs, num_queries = 2, 5
    info = _projection(bs, num_queries)
    lidar, camera = torch.rand(bs, num_queries), torch.rand(bs, num_queries)
    plain = AttentionBiasGenerator(window_size=3, bias_scale=0.7)
    muted = AttentionBiasGenerator(window_size=3, bias_scale=0.7, mute_scale=2.5)
    assert 'mute_scale' not in dict(plain.named_parameters()) and 'mute' in repr(muted)
    window = plain(lidar, camera, info, BEV_SHAPE, CAMERA_SHAPE, num_dn_queries=num_dn).to_dense()[:, 0]
    bias = muted(lidar, camera, info, BEV_SHAPE, CAMERA_SHAPE, num_dn_queries=num_dn)
    assert {type(part) for part in bias.parts} == {WindowBias, SegmentBias}
    mute = bias.to_dense()[:, 0] - window
    assert torch.all(mute[:, :num_dn] == 0), 'DN queries get no mute term'
    assert torch.allclose(mute[:, num_dn:, :NUM_BEV], (-2.5 * (1 - lidar))[..., None].expand(-1, -1, NUM_BEV))
    assert torch.allclose(mute[:, num_dn:, NUM_BEV:],
                          (-2.5 * (1 - camera))[..., None].expand(-1, -1, NUM_KEYS - NUM_BEV))
    bias.to_dense().sum().backward()
    assert muted.mute_scale.grad is not None and muted.mute_scale.grad != 0
    # a strong mute with a camera weight of 0 leaves (almost) no attention on the camera keys
    strong = AttentionBiasGenerator(window_size=3, bias_scale=0.7, mute_scale=50.0)
    heads, dim = 2, 8
    q, k = torch.randn(bs, heads, num_queries, dim), torch.randn(bs, heads, NUM_KEYS, dim)
    v = torch.zeros(bs, heads, NUM_KEYS, dim)
    v[:, :, NUM_BEV:] = 1.0
    out = apply_attention(q, k, v, bias=strong(torch.ones(bs, num_queries), torch.zeros(bs, num_queries), info,
                                               BEV_SHAPE, CAMERA_SHAPE), backend='math')
    assert out.abs().max() < 1e-6
    with pytest.raises(ValueError, match='the global bias'):
        AttentionBiasGenerator(use_local_bias=False, mute_scale=1.0)
    with pytest.raises(ValueError, match='mute_scale must be >= 0'):
        AttentionBiasGenerator(mute_scale=-1.0)
