"""PositionEmbedding: BEV, camera and query position embeddings whose sizes come from the features."""
import pytest
import torch

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.dense_heads.position_embedding import PositionEmbedding
from projects.mmdet3d_plugin.models.utils.camera_geometry import CameraGeometry
from projects.mmdet3d_plugin.models.utils.image_targets import lift_cell_centres
from projects.mmdet3d_plugin.models.utils.positional_encoding import bev_grid_coords, normalize_points, pos2embed
from test_cmt_head import C, PC_RANGE, features, head_cfg, metas


def test_bev_position_embedding_follows_the_feature_map():
    positions = head_cfg().positions
    embed = positions.bev(torch.zeros(1, 16, 5, 6))
    assert embed.shape == (30, C)
    # token h * W + w is the cell (row h, column w): x from the column, y from the row
    cell = torch.tensor([[(3 + 0.5) / 6, (2 + 0.5) / 5]])
    torch.testing.assert_close(embed[2 * 6 + 3], positions.bev_embedding(pos2embed(cell, C))[0])
    torch.testing.assert_close(bev_grid_coords(5, 6)[2 * 6 + 3], cell[0])
    assert positions.bev(None) is None


def test_camera_position_embedding_sizes_come_from_the_features(cmt_test_data):
    positions = head_cfg().positions
    _, img = features()
    geometry = CameraGeometry.from_metas(metas(cmt_test_data))
    embed = positions.frustum(img, geometry)
    assert embed.shape == (4, 4, 10, C)
    with pytest.raises(ValueError, match='views'):
        positions.frustum(img[:3], geometry)


def test_query_embedding_sums_only_the_views_that_see_the_point(cmt_test_data):
    positions = head_cfg().positions
    img_metas = metas(cmt_test_data, bs=1)
    geometry = CameraGeometry.from_metas(img_metas)
    ahead = torch.tensor([[[0.75, 0.5, 0.6]]])  # x = +6 m: in the front camera only
    above = torch.tensor([[[0.5, 0.5, 1.0]]])  # straight above the cameras: in no view
    bev_only = positions.bev_embedding(pos2embed(above, C))
    torch.testing.assert_close(positions.queries(above, geometry), bev_only)
    camera_part = positions.queries(ahead, geometry) - positions.bev_embedding(pos2embed(ahead, C))
    assert camera_part.abs().sum() > 0
    front_only = dict(img_metas[0], **{key: img_metas[0][key][:1] for key in ('lidar2img', 'img_shape', 'pad_shape')})
    torch.testing.assert_close(positions.camera_queries(ahead, CameraGeometry.from_metas([front_only])), camera_part)


def test_without_a_camera_the_queries_embed_their_bev_position_only(cmt_test_data):
    bev_embedding = torch.nn.Linear(2 * C, C)
    positions = PositionEmbedding(bev_embedding, None, PC_RANGE, depth_num=4, hidden_dim=C)
    ahead = torch.tensor([[[0.75, 0.5, 0.6]]])
    torch.testing.assert_close(positions.queries(ahead, None), bev_embedding(pos2embed(ahead, C)))


def test_token_depth_embeds_the_lifted_cell_centres(cmt_test_data):
    positions = head_cfg().positions
    _, img = features()
    geometry = CameraGeometry.from_metas(metas(cmt_test_data))
    depth = torch.rand(4, 4, 10) * 10 + 1
    frustum = positions.frustum(img, geometry)
    assert positions.camera(frustum, None, geometry) is frustum
    with_depth = positions.camera(frustum, depth, geometry)
    points = lift_cell_centres(depth, geometry.img2lidar.flatten(0, 1), geometry.pad_hw)
    expected = positions.bev_embedding(pos2embed(normalize_points(points, PC_RANGE).clamp(0, 1), C))
    torch.testing.assert_close(with_depth - frustum, expected, atol=1e-5, rtol=1e-5)
    nearer = positions.camera(frustum, depth * 0.5, geometry)
    assert (nearer - with_depth).abs().amax(dim=-1).min() > 0, 'every token moves with its depth'
