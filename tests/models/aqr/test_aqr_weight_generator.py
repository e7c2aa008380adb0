"""AQRWeightGenerator end to end on a tiny rig: shapes, ranges, invisible queries, gradients, aux loss, granularity."""
import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.models.aqr import AQRWeightGenerator
from projects.mmdet3d_plugin.models.aqr.aux_loss import modality_drop_flags, routing_loss
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry

EMBED = 32


def _inputs(rig, bs=2, num_queries=5, views=2, bev=(8, 8), feat=(4, 6)):
    metas = [rig['meta']([rig['front'](), rig['back']()][:views]) for _ in range(bs)]
    points = np.array([[5.0, 0.0, 0.0], [-5.0, 1.0, 0.0], [0.0, 9.0, 0.0], [9.0, -9.0, 2.0], [1.0, 1.0, 1.0]])
    reference = torch.tensor(rig['normalise'](points[:num_queries]), dtype=torch.float32)
    return dict(
        query_embed=torch.randn(bs, num_queries, EMBED),
        reference_points=reference[None].expand(bs, -1, -1).clone(),
        bev_feat=torch.randn(bs, EMBED, *bev),
        img_feat=torch.randn(bs * views, EMBED, *feat),
        geometry=CameraGeometry.from_metas(metas),
        pc_range=rig['pc_range'],
        bev_pos=torch.randn(bev[0] * bev[1], EMBED),
        img_pos=torch.randn(bs * views, feat[0], feat[1], EMBED))


@pytest.mark.parametrize('activation', ['sigmoid', 'softmax'])
def test_weights_are_probabilities_with_projection_info(rig, activation):
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[3, 3], feedforward_channels=64,
                                   weight_activation=activation).eval()
    inputs = _inputs(rig)
    lidar, camera, info = generator(**inputs)
    assert lidar.shape == camera.shape == (2, 5)
    for weights in (lidar, camera):
        assert torch.isfinite(weights).all() and (weights >= 0).all() and (weights <= 1).all()
    assert info['pts_bev'].shape == (2, 5, 2) and info['pts_idx'].shape == (2, 5)
    assert info['pts_pers_idx'].shape == (2, 5, 3) and info['visible'].shape == (2, 5)
    # (5, 0, 0) is seen by the front camera, (0, 9, 0) by neither
    assert info['visible'][:, 0].all() and not info['visible'][:, 2].any()
    assert (info['pts_pers_idx'][:, 2] == -1).all()


def test_invisible_query_depends_only_on_its_lidar_window(rig):
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[3, 3], feedforward_channels=64,
                                   weight_head_std=0.01).eval()
    inputs = _inputs(rig, bs=1)
    lidar, camera, info = generator(**inputs)
    assert not info['visible'][0, 2]
    changed = dict(inputs, img_feat=torch.randn_like(inputs['img_feat']) * 10)
    lidar2, camera2, _ = generator(**changed)
    assert torch.allclose(lidar[0, 2], lidar2[0, 2]) and torch.allclose(camera[0, 2], camera2[0, 2])
    assert not torch.allclose(lidar[0, 0], lidar2[0, 0]), 'a visible query must see the camera features'


@pytest.mark.parametrize('weight_head_std', [0.0, 0.01])
def test_gradients_reach_every_parameter_and_the_features(rig, weight_head_std):
    """From a zero weight head (the default) only the head has a gradient at the first step; once its weights
    are not zero (after that step, or ``weight_head_std > 0``) every parameter and the features have one."""
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[3, 3], feedforward_channels=64,
                                   dropout=0.0, weight_head_std=weight_head_std)
    inputs = _inputs(rig)
    inputs['bev_feat'].requires_grad_(True)
    inputs['img_feat'].requires_grad_(True)
    lidar, camera, _ = generator(**inputs)
    (lidar.sum() - camera.sum()).backward()
    with_grad = [name for name, p in generator.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    if weight_head_std == 0:
        assert with_grad == ['weight_head.weight', 'weight_head.bias']
        return
    assert with_grad == [name for name, _ in generator.named_parameters()]
    assert inputs['bev_feat'].grad.abs().sum() > 0 and inputs['img_feat'].grad.abs().sum() > 0


@pytest.mark.parametrize('init_weight, expected', [(None, 0.5), (0.9, 0.9)])
def test_every_query_starts_exactly_at_init_weight(rig, init_weight, expected):
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[3, 3], feedforward_channels=64,
                                   init_weight=init_weight)
    for weights in generator(**_inputs(rig))[:2]:
        torch.testing.assert_close(weights, torch.full_like(weights, expected), atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match='weight_head_std must be >= 0'):
        AQRWeightGenerator(weight_head_std=-0.1)


def test_sizes_come_from_the_inputs(rig):
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[5, 3], feedforward_channels=64).eval()
    lidar, _, info = generator(**_inputs(rig, bs=1, num_queries=3, views=1, bev=(5, 9), feat=(3, 7)))
    assert lidar.shape == (1, 3)
    assert (info['pts_bev'][..., 0] < 5).all() and (info['pts_bev'][..., 1] < 9).all()
    assert (info['pts_pers_idx'][..., 1] < 3).all() and (info['pts_pers_idx'][..., 2] < 7).all()


@pytest.mark.parametrize('activation, init_weight, expected', [
    ('sigmoid', None, (0.5, 0.5)), ('softmax', None, (2 / 3, 2 / 3)), ('sigmoid', 0.9, (0.9, 0.9)),
    ('sigmoid', 0.2, (0.2, 0.2)), ('softmax', 0.9, (0.9, 0.9)), ('sigmoid', [0.9, 0.5], (0.9, 0.5)),
    ('softmax', [0.8, 0.4], (0.8, 0.4))])
def test_weights_start_at_init_weight(rig, activation, init_weight, expected):
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[3, 3], feedforward_channels=64,
                                   weight_activation=activation, init_weight=init_weight).eval()
    lidar, camera, _ = generator(**_inputs(rig))
    for weights, value in zip((lidar, camera), expected):
        torch.testing.assert_close(weights, torch.full_like(weights, value), atol=0.06, rtol=0)


def test_bad_config_and_shapes_raise(rig):
    with pytest.raises(ValueError, match='init_weight'):
        AQRWeightGenerator(init_weight=1.0)
    with pytest.raises(ValueError, match='pair'):
        AQRWeightGenerator(init_weight=[0.9, 0.5, 0.1])
    with pytest.raises(ValueError, match='sum to more than 1'):
        AQRWeightGenerator(weight_activation='softmax', init_weight=0.4)
    with pytest.raises(ValueError, match='window_sizes'):
        AQRWeightGenerator(window_sizes=[15])
    with pytest.raises(ValueError, match='weight_activation'):
        AQRWeightGenerator(weight_activation='relu')
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[3, 3], feedforward_channels=64)
    inputs = _inputs(rig)
    with pytest.raises(ValueError, match='reference_points'):
        generator(**dict(inputs, reference_points=inputs['reference_points'][:, :2]))
    with pytest.raises(ValueError, match='views'):
        generator(**dict(inputs, img_feat=torch.randn(2 * 3, EMBED, 4, 6), img_pos=None))


def test_routing_loss_targets_dropped_modalities_only():
    metas = [dict(dropped_modalities=['points']), dict(), dict(dropped_modalities=('image', ))]
    lidar_dropped, camera_dropped = modality_drop_flags(metas, torch.device('cpu'))
    assert lidar_dropped.tolist() == [True, False, False] and camera_dropped.tolist() == [False, False, True]
    weights_low = torch.full((3, 4), 0.01)
    weights_high = torch.full((3, 4), 0.99)
    assert routing_loss(weights_low, weights_low, lidar_dropped, camera_dropped) < 0.02
    assert routing_loss(weights_high, weights_low, lidar_dropped, camera_dropped) > 2.0
    # sample 1 dropped nothing: its weights carry no target
    assert routing_loss(weights_low, weights_low, torch.zeros(3, dtype=torch.bool),
                        torch.zeros(3, dtype=torch.bool)) == 0
    with pytest.raises(ValueError, match='unknown modalities'):
        modality_drop_flags([dict(dropped_modalities=['radar'])], torch.device('cpu'))
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, feedforward_channels=64, aux_loss_weight=0.5)
    losses = generator.loss(weights_high, weights_low, metas)
    assert torch.allclose(losses['loss_aqr_routing'], 0.5 * routing_loss(weights_high, weights_low, lidar_dropped,
                                                                          camera_dropped))
    assert AQRWeightGenerator(embed_dims=EMBED, num_heads=4, feedforward_channels=64).loss(
        weights_high, weights_low, metas) == {}


def test_a_whole_sensor_corruption_drops_its_modality_for_the_routing_loss():
    """MoME's per-sample label also holds for a sample whose training corruption removed a whole sensor."""
    metas = [dict(corruption=dict(name='camera_drop', mode='camera_drop', views=[0, 1])),
             dict(corruption=dict(name='lidar_drop', mode='lidar_drop')),
             dict(corruption=dict(name='camera_fail:0.4', mode='camera_fail', views=[1])),
             dict(corruption=None, dropped_modalities=['image']),
             dict(corruption=dict(name='camera_drop', mode='camera_drop'), dropped_modalities=['image'])]
    lidar_dropped, camera_dropped = modality_drop_flags(metas, torch.device('cpu'))
    assert lidar_dropped.tolist() == [False, True, False, False, False]
    assert camera_dropped.tolist() == [True, False, False, True, True]


def _generator(**options):
    torch.manual_seed(0)
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, window_sizes=[3, 3], feedforward_channels=64,
                                   **options).eval()
    with torch.no_grad():  # spread the logits so that queries and samples clearly differ
        torch.nn.init.normal_(generator.weight_head.weight, std=0.5)
    return generator


def _per_sample(routing, state_dict):
    generator = _generator(granularity='sample', **routing)
    generator.load_state_dict(state_dict)
    return generator


@pytest.mark.parametrize('activation', ['sigmoid', 'softmax'])
def test_sample_granularity_gives_every_query_of_a_sample_the_same_weights(rig, activation):
    per_query = _generator(weight_activation=activation)
    per_sample = _per_sample(dict(weight_activation=activation), per_query.state_dict())
    torch.manual_seed(1)
    inputs = _inputs(rig, bs=2, num_queries=5)
    lidar_q, camera_q, _ = per_query(**inputs)
    lidar, camera, info = per_sample(**inputs)
    assert lidar.shape == camera.shape == (2, 5) and info['pts_bev'].shape == (2, 5, 2)
    for weights, per_query_weights in ((lidar, lidar_q), (camera, camera_q)):
        assert torch.equal(weights, weights[:, :1].expand_as(weights)), 'one weight per sample'
        assert (per_query_weights.max(dim=1).values - per_query_weights.min(dim=1).values > 1e-3).all()
        assert (weights[0, 0] - weights[1, 0]).abs() > 1e-4, 'the samples differ'


def test_sample_weight_is_the_activation_of_the_mean_query_logit(rig):
    per_query = _generator()
    per_sample = _per_sample({}, per_query.state_dict())
    inputs = _inputs(rig, bs=2, num_queries=5)
    lidar_q, camera_q, _ = per_query(**inputs)
    lidar, camera, _ = per_sample(**inputs)
    for weights, per_query_weights in ((lidar, lidar_q), (camera, camera_q)):
        expected = per_query_weights.double().logit().mean(dim=1).sigmoid()
        assert torch.allclose(weights[:, 0].double(), expected, atol=1e-5)


def test_query_granularity_is_the_default_and_unchanged(rig):
    default, explicit = _generator(), _generator(granularity='query')
    assert list(default.state_dict()) == list(explicit.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), explicit.state_dict().values()))
    inputs = _inputs(rig)
    for a, b in zip(default(**inputs)[:2], explicit(**inputs)[:2]):
        assert torch.equal(a, b)
    assert list(_generator(granularity='sample').state_dict()) == list(default.state_dict())


def test_unknown_granularity_raises():
    with pytest.raises(ValueError, match=r"granularity must be one of \('query', 'sample'\), got 'batch'"):
        AQRWeightGenerator(embed_dims=EMBED, num_heads=4, feedforward_channels=64, granularity='batch')


def test_the_lie_labels_mark_the_lying_modality_of_a_sample():
    """With lie_targets a sample's ghosts or misaligned cloud label LiDAR lost, its yawed views camera: both for
    mixed_lie; the flags without lies and the other samples are unchanged."""
    ghost = [[5.0, 0.0, -1.0, 4.0, 2.0, 1.5, 0.0]]
    metas = [dict(corruption=dict(mode='lidar_ghost', ghost_boxes=ghost)),
             dict(corruption=dict(mode='view_yaw', yawed_views=[1, 4])),
             dict(corruption=dict(mode='lidar_misalign', misaligned=True)),
             dict(corruption=dict(mode='lidar_misalign', misaligned=False)),
             dict(corruption=dict(mode='mixed_lie', yawed_views=[0], ghost_boxes=ghost)),
             dict(dropped_modalities=['image'])]
    lidar, camera = modality_drop_flags(metas, torch.device('cpu'), lies=True)
    assert lidar.tolist() == [True, False, True, False, True, False]
    assert camera.tolist() == [False, True, False, False, True, True]
    lidar, camera = modality_drop_flags(metas, torch.device('cpu'))
    assert not lidar.any() and camera.tolist() == [False] * 5 + [True]
    generator = AQRWeightGenerator(embed_dims=EMBED, num_heads=4, feedforward_channels=64, aux_loss_weight=1.0,
                                   lie_targets=True)
    high = torch.full((6, 4), 0.99)
    lidar, camera = modality_drop_flags(metas, torch.device('cpu'), lies=True)
    expected = routing_loss(high, high, lidar, camera)
    assert torch.allclose(generator.loss(high, high, metas)['loss_aqr_routing'], expected)
