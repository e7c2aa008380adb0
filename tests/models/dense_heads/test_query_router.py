"""QueryRouter: AQR's weights -> the cross-attention bias (or, legacy, modulated features); off without aqr_config."""
import pytest
import torch

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.attention import AttentionBias
from projects.mmdet3d_plugin.models.aqr import AttentionBiasGenerator
from projects.mmdet3d_plugin.models.dense_heads.pass_plan import DecoderMemory
from projects.mmdet3d_plugin.models.dense_heads.query_router import QueryRouter, routing_mode
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry
from test_cmt_head import C, PC_RANGE, head_cfg

ROUTING = dict(aqr_config=dict(type='AQRWeightGenerator', window_sizes=[3, 3], weight_head_std=0.01),
               attention_bias_config=dict(type='AttentionBiasGenerator', window_size=3, bias_scale=2.0))
BS, NUM_DN, Q = 2, 3, 5


@pytest.fixture(scope='module')
def decoder():
    return head_cfg().transformer.decoder


def build(decoder, routing=ROUTING, fusion=True):
    torch.manual_seed(0)
    return QueryRouter.build(routing, C, decoder, fusion, PC_RANGE)


def inputs(cmt_test_data):
    memory = DecoderMemory(torch.randn(BS, C, 4, 5), torch.randn(20, C), torch.randn(BS * 2, C, 4, 6),
                           torch.randn(BS * 2, 4, 6, C))
    metas = cmt_test_data['make_img_metas'](BS)
    geometry = CameraGeometry.from_metas(metas)
    return torch.rand(BS, NUM_DN + Q, 3), torch.randn(BS, NUM_DN + Q, C), memory, metas, geometry


def test_without_aqr_config_the_memory_passes_unchanged(decoder, cmt_test_data):
    router = build(decoder, None)
    assert not router.enabled and not router.needs_gt_point_counts and not router.uses_oracle(dict(aqr_routing='oracle'))
    assert router.modules == dict(aqr_weight_generator=None, attention_bias_generator=None)
    reference_points, query_embed, memory, metas, geometry = inputs(cmt_test_data)
    assert router.route(reference_points, query_embed, memory, metas, geometry, NUM_DN) == (memory, None)
    assert router.loss(None, None, [], None) == {}


def test_route_biases_the_matching_queries_and_leaves_the_features(decoder, cmt_test_data):
    router = build(decoder)
    assert list(router.modules) == ['aqr_weight_generator', 'attention_bias_generator']
    assert isinstance(router.bias_generator, AttentionBiasGenerator) and not router.modulates_features
    reference_points, query_embed, memory, metas, geometry = inputs(cmt_test_data)
    routed, routing = router.route(reference_points, query_embed, memory, metas, geometry, NUM_DN)
    assert routed.bev_feat is memory.bev_feat and routed.img_feat is memory.img_feat
    assert routing.lidar_weights.shape == routing.camera_weights.shape == (BS, Q)
    bias = routed.cross_attn_bias
    assert isinstance(bias, AttentionBias) and bias.num_keys == 20 + 2 * 4 * 6
    dense = bias.to_dense()
    assert dense.shape[-2:] == (NUM_DN + Q, 20 + 48)
    assert (dense[..., :NUM_DN, :] == 0).all() and dense[..., NUM_DN:, :].abs().sum() > 0, 'DN queries: no bias'


def test_legacy_feature_modulation_is_its_own_part_and_gives_no_bias(decoder, cmt_test_data):
    router = build(decoder, dict(aqr_config=ROUTING['aqr_config'], modulation='feature',
                                 weight_renderer_config=dict(type='WeightRenderer', kernel='window', window_size=3)))
    assert router.bias_generator is None and router.modulates_features
    assert list(router.modules) == ['aqr_weight_generator', 'attention_bias_generator', 'weight_renderer',
                                    'feature_modulator']
    reference_points, query_embed, memory, metas, geometry = inputs(cmt_test_data)
    routed, routing = router.route(reference_points, query_embed, memory, metas, geometry, NUM_DN)
    assert routed.cross_attn_bias is None and routed.bev_pos is memory.bev_pos
    legacy = router.feature_modulation
    maps = legacy.weight_renderer(routing.lidar_weights, routing.camera_weights, routing.projection_info, (4, 5),
                                  (2, 4, 6))
    torch.testing.assert_close(routed.bev_feat, legacy.feature_modulator(memory.bev_feat, maps[0]))
    torch.testing.assert_close(routed.img_feat, legacy.feature_modulator(memory.img_feat, maps[1]))


def test_the_oracle_reads_the_points_and_the_test_routing_is_checked(decoder, cmt_test_data):
    router = build(decoder)
    assert router.uses_oracle(dict(aqr_routing='oracle')) and not router.uses_oracle(None)
    reference_points, query_embed, memory, metas, geometry = inputs(cmt_test_data)
    with pytest.raises(KeyError, match="no 'lidar_points'"):
        router.route(reference_points, query_embed, memory, metas, geometry, NUM_DN, oracle='oracle')
    metas = [dict(meta, lidar_points=torch.zeros(1, 3)) for meta in metas]
    _, routing = router.route(reference_points, query_embed, memory, metas, geometry, NUM_DN, oracle='oracle')
    assert set(torch.cat([routing.lidar_weights, routing.camera_weights]).unique().tolist()) <= {0.0, 1.0}
    with pytest.raises(ValueError, match=r"test_cfg\['aqr_routing'\] must be one of"):
        routing_mode(dict(aqr_routing='best'))


def test_the_lie_oracle_mutes_lying_lidar_and_yawed_views(decoder, cmt_test_data):
    """``oracle_lies``: LiDAR 0 for every query of a misaligned cloud and near a ghost, camera 0 in a yawed view;
    the plain oracle believes both."""
    router = build(decoder)
    reference_points, query_embed, memory, metas, geometry = inputs(cmt_test_data)
    reference_points[:, NUM_DN:] = torch.tensor([0.75, 0.5, 0.625])  # (6, 0, 0) m: in front of view 0
    points = torch.tensor([[6.0, 0.0, -1.8], [6.2, 0.3, -0.2]])  # the ground and a point standing on it
    weights = {}
    for name, corruption in (('truth', dict(ghost_boxes=[], yawed_views=[])),
                             ('misaligned', dict(misaligned=True)),
                             ('ghost', dict(ghost_boxes=[[7.0, 1.0, -1.8, 4.0, 2.0, 1.5, 0.3]])),
                             ('far ghost', dict(ghost_boxes=[[-8.0, -8.0, -1.8, 4.0, 2.0, 1.5, 0.3]])),
                             ('yawed', dict(yawed_views=[0, 1]))):
        lied = [dict(meta, lidar_points=points, corruption=corruption) for meta in metas]
        for oracle in ('oracle', 'oracle_lies'):
            _, routing = router.route(reference_points, query_embed, memory, lied, geometry, NUM_DN, oracle=oracle)
            weights[name, oracle] = routing.lidar_weights, routing.camera_weights
    lidar, camera = weights['truth', 'oracle_lies']
    assert (lidar == 1).all() and (camera == 1).all(), 'the test needs queries over points, seen by a view'
    for name in ('truth', 'misaligned', 'ghost', 'far ghost', 'yawed'):
        torch.testing.assert_close(weights[name, 'oracle'], weights['truth', 'oracle'])
    assert (weights['misaligned', 'oracle_lies'][0] == 0).all() and (weights['ghost', 'oracle_lies'][0] == 0).all()
    torch.testing.assert_close(weights['far ghost', 'oracle_lies'], weights['truth', 'oracle_lies'])
    assert (weights['yawed', 'oracle_lies'][1] == 0).all()
    torch.testing.assert_close(weights['yawed', 'oracle_lies'][0], lidar)


def test_bad_routing_configs_raise(decoder):
    for routing, error, message in (
            (dict(attention_bias_config=ROUTING['attention_bias_config']), ValueError, 'need aqr_config'),
            (dict(aqr_config=ROUTING['aqr_config']), ValueError, 'needs attention_bias_config'),
            (dict(ROUTING, modulation='feature'), ValueError, 'attention_bias_config is unused'),
            (dict(ROUTING, weight_renderer_config=dict(type='WeightRenderer')), ValueError, "belong to modulation='f"),
            (dict(ROUTING, modulation='weights'), ValueError, 'modulation must be one of'),
            (dict(ROUTING, window=3), TypeError, r"unknown routing options \['window'\]"),
    ):
        with pytest.raises(error, match=message):
            build(decoder, routing)
    with pytest.raises(ValueError, match='needs a fusion head'):
        build(decoder, fusion=False)
