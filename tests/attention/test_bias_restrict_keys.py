"""restrict_keys: every kind of cross-attention bias cut to a key range equals the dense bias's slice and keeps its
structure (``AttentionBias.restrict_keys`` and each part's, the module function for tensors and per-layer biases)."""
import pytest
import torch

from projects.mmdet3d_plugin.attention import (AttentionBias, DenseBias, KeyGrid, LowRankBias, SegmentBias,
                                               WindowBias, restrict_keys)
from projects.mmdet3d_plugin.models.utils.petr_transformer import PerLayer

BS, HEADS, Q = 2, 3, 5
BEV_H, BEV_W = 4, 5
VIEWS, IMG_H, IMG_W = 2, 3, 4
NUM_BEV, NUM_CAMERA = BEV_H * BEV_W, VIEWS * IMG_H * IMG_W
K = NUM_BEV + NUM_CAMERA
RANGES = {'bev': (0, NUM_BEV), 'camera': (NUM_BEV, K), 'inner': (3, NUM_BEV + 7)}


def window_part() -> WindowBias:
    """AQR's local bias: a window on the BEV grid and one on the camera grid."""
    grids = (KeyGrid(0, 1, BEV_H, BEV_W), KeyGrid(NUM_BEV, VIEWS, IMG_H, IMG_W))
    bev_centres = torch.stack([torch.zeros(BS, Q), torch.randint(0, BEV_H, (BS, Q)),
                               torch.randint(0, BEV_W, (BS, Q))], -1).long()
    camera_centres = torch.stack([torch.randint(0, VIEWS, (BS, Q)), torch.randint(0, IMG_H, (BS, Q)),
                                  torch.randint(0, IMG_W, (BS, Q))], -1).long()
    valid = (torch.ones(BS, Q, dtype=torch.bool), torch.rand(BS, Q) > 0.3)
    return WindowBias(grids, (bev_centres, camera_centres), valid, (torch.randn(BS, 1, Q), torch.randn(BS, HEADS, Q)),
                      (3, 5))


def parts():
    return {
        'segment': SegmentBias(torch.randn(BS, HEADS, Q, 2), (NUM_BEV, NUM_CAMERA)),
        'low_rank': LowRankBias(torch.randn(BS, 1, Q, 3), torch.randn(BS, K, 3)),
        'dense': DenseBias(torch.randn(BS, HEADS, Q, K)),
        'dense_broadcast_keys': DenseBias(torch.randn(BS, 1, Q, 1)),
    }


@pytest.mark.parametrize('name', ['segment', 'low_rank', 'dense', 'dense_broadcast_keys', 'sum'])
@pytest.mark.parametrize('key_range', ['bev', 'camera', 'inner'])
def test_restricted_bias_is_the_dense_slice_and_keeps_its_structure(name, key_range):
    torch.manual_seed(0)
    all_parts = parts()
    bias = AttentionBias(list(all_parts.values()) if name == 'sum' else all_parts[name], K)
    start, end = RANGES[key_range]
    restricted = bias.restrict_keys(start, end)
    assert restricted.num_keys == end - start
    assert [type(p) for p in restricted.parts] == [type(p) for p in bias.parts], 'a part lost its structure'
    expected = bias.to_dense()
    torch.testing.assert_close(restricted.to_dense(), expected.expand(-1, -1, -1, K)[..., start:end])


def test_segments_outside_the_range_are_dropped():
    values = torch.randn(BS, 1, Q, 2)
    camera = AttentionBias(SegmentBias(values, (NUM_BEV, NUM_CAMERA)), K).restrict_keys(NUM_BEV, K)
    (part, ) = camera.parts
    assert part.segment_lengths == (NUM_CAMERA, )
    assert torch.equal(part.values, values[..., 1:])


@pytest.mark.parametrize('key_range', ['bev', 'camera'])
def test_window_bias_keeps_the_grids_of_the_range_renumbered(key_range):
    torch.manual_seed(0)
    bias = AttentionBias(window_part(), K)
    start, end = RANGES[key_range]
    restricted = bias.restrict_keys(start, end)
    (part, ) = restricted.parts
    assert len(part.grids) == 1 and part.grids[0].offset == 0 and part.grids[0].num_cells == end - start
    expected = bias.to_dense()[..., start:end]
    torch.testing.assert_close(restricted.to_dense().expand_as(expected), expected)


def test_a_window_grid_cut_by_the_range_raises():
    with pytest.raises(ValueError, match='cuts the window grid'):
        AttentionBias(window_part(), K).restrict_keys(*RANGES['inner'])


def test_nothing_left_in_the_range_gives_none_and_bad_ranges_raise():
    bev_only = AttentionBias(WindowBias(KeyGrid(0, 1, BEV_H, BEV_W), torch.zeros(BS, Q, 3, dtype=torch.long),
                                        torch.ones(BS, Q, dtype=torch.bool), torch.ones(BS, 1, Q), 3), K)
    assert bev_only.restrict_keys(NUM_BEV, K) is None
    assert restrict_keys(bev_only, NUM_BEV, K) is None and restrict_keys(None, 0, 3) is None
    for start, end in ((0, K + 1), (5, 5), (-1, 3)):
        with pytest.raises(ValueError, match='is not inside'):
            restrict_keys(bev_only, start, end)
    with pytest.raises(TypeError, match='cannot restrict'):
        restrict_keys([torch.zeros(3)], 0, 1)


def test_tensors_and_per_layer_biases():
    mask = torch.rand(Q, K) > 0.5
    assert torch.equal(restrict_keys(mask, NUM_BEV, K), mask[:, NUM_BEV:])
    column = torch.randn(BS, 1, Q, 1)
    assert restrict_keys(column, 0, NUM_BEV) is column
    layers = PerLayer(AttentionBias(SegmentBias(torch.full((BS, 1, Q, 2), float(i)), (NUM_BEV, NUM_CAMERA)), K)
                      for i in range(3))
    restricted = restrict_keys(layers, 0, NUM_BEV)
    assert isinstance(restricted, PerLayer) and len(restricted) == 3
    for i, layer in enumerate(restricted):
        assert layer.num_keys == NUM_BEV and torch.all(layer.to_dense() == i)
