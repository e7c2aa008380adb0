"""Per-query routing targets: point counts per box, live cameras, targets of matched queries, the BCE."""
import math

import pytest
import torch
from mmcv.ops import points_in_boxes_cpu
from mmdet.models.builder import build_head

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.models.aqr.routing_targets import (camera_visible_objects, count_points_in_boxes,
                                                                  lidar_occupancy, lidar_untrusted, live_camera_views,
                                                                  matched_object_targets, oracle_routing_weights,
                                                                  query_target_loss, unmatched_query_targets)
from projects.mmdet3d_plugin.models.utils.camera_geometry import stack_lidar2img

def test_point_counts_equal_mmcv_points_in_boxes():
    torch.manual_seed(0)
    boxes = torch.cat([torch.rand(20, 2) * 20 - 10, torch.rand(20, 1) - 2, torch.rand(20, 3) * 3 + 0.5,
                       torch.rand(20, 1) * 2 * math.pi - math.pi], dim=1)
    points = torch.cat([torch.rand(5000, 2) * 24 - 12, torch.rand(5000, 1) * 4 - 2.5, torch.rand(5000, 2)], dim=1)
    expected = points_in_boxes_cpu(points[None, :, :3], boxes[None])[0].sum(dim=0)
    assert expected.sum() > 50, 'the check needs points inside boxes'
    assert torch.equal(count_points_in_boxes(points, boxes), expected.long())


def test_point_counts_follow_the_yaw():
    """A long box rotated by 90 degrees holds the points along y, not those along x."""
    box = torch.tensor([[0.0, 0.0, -1.0, 4.0, 1.0, 2.0, math.pi / 2]])
    along_y, along_x = torch.tensor([[0.0, 1.8, 0.0]]), torch.tensor([[1.8, 0.0, 0.0]])
    assert count_points_in_boxes(along_y, box).item() == 1
    assert count_points_in_boxes(along_x, box).item() == 0
    assert count_points_in_boxes(torch.zeros(0, 3), box).tolist() == [0]
    assert count_points_in_boxes(along_x, box[:0]).numel() == 0


def test_live_views_read_modality_drop_and_corruption(cmt_test_data):
    assert live_camera_views({}, 3, torch.device('cpu')).tolist() == [True, True, True]
    assert live_camera_views(dict(dropped_modalities=['image']), 3, torch.device('cpu')).tolist() == [False] * 3
    assert live_camera_views(dict(dropped_modalities=['points']), 2, torch.device('cpu')).tolist() == [True, True]
    assert live_camera_views(dict(corruption=dict(views=[2])), 3, torch.device('cpu')).tolist() == [True, True, False]
    with pytest.raises(ValueError, match='names view 5'):
        live_camera_views(dict(corruption=dict(views=[5])), 3, torch.device('cpu'))


def test_camera_visibility_needs_a_live_view_in_front(cmt_test_data):
    """The test cameras look along +x (view 0) and -x (view 1); +-y at the side is seen by neither."""
    meta = cmt_test_data['make_img_metas'](1)[0]
    lidar2img = stack_lidar2img([meta])[0]
    centres = torch.tensor([[10.0, 0.0, 0.0], [-10.0, 0.0, 0.0], [0.0, 10.0, 0.0]])
    assert camera_visible_objects(centres, lidar2img, meta).tolist() == [True, True, False]
    front_failed = dict(meta, corruption=dict(views=[0]))
    assert camera_visible_objects(centres, lidar2img, front_failed).tolist() == [False, True, False]
    images_dropped = dict(meta, dropped_modalities=['image'])
    assert camera_visible_objects(centres, lidar2img, images_dropped).tolist() == [False, False, False]


def test_matched_targets_average_over_matchings():
    lidar, camera = torch.tensor([True, False, True]), torch.tensor([True, True, False])
    first = torch.tensor([0, -1, 1, -1])
    second = torch.tensor([-1, -1, 2, 0])
    targets, matched = matched_object_targets([first, second], lidar, camera)
    assert matched.tolist() == [True, False, True, True]
    assert targets.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.5, 0.5], [1.0, 1.0]]


def test_query_loss_is_bce_over_matched_queries_only():
    lidar_weights = torch.tensor([[0.9, 0.2, 0.5]])
    camera_weights = torch.tensor([[0.3, 0.7, 0.5]])
    targets = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    loss = query_target_loss(lidar_weights, camera_weights, targets, torch.tensor([[True, True, False]]))
    expected = -(math.log(0.9) + math.log(0.7) + math.log(0.8) + math.log(0.7)) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    unmatched = query_target_loss(lidar_weights, camera_weights, targets, torch.zeros(1, 3, dtype=torch.bool))
    assert unmatched.item() == 0


def test_bad_options_are_rejected():
    with pytest.raises(ValueError, match='query_loss_weight'):
        build_head(dict(type='AQRWeightGenerator', embed_dims=32, num_heads=4, query_loss_weight=-1.0))
    with pytest.raises(ValueError, match='min_lidar_points'):
        build_head(dict(type='AQRWeightGenerator', embed_dims=32, num_heads=4, min_lidar_points=0))


def test_lidar_occupancy_marks_the_cells_of_points_in_range():
    pc_range = [-4.0, -2.0, -1.0, 4.0, 2.0, 1.0]  # 8 m x 4 m on a 2 x 4 grid: cells of 2 m
    points = torch.tensor([[-3.5, -1.5, 0.0], [3.9, 1.9, 0.5], [1.0, -1.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    occupancy = lidar_occupancy(points, pc_range, (2, 4))
    assert occupancy.tolist() == [[True, False, True, False], [False, False, False, True]]
    assert not lidar_occupancy(torch.zeros(0, 3), pc_range, (2, 4)).any()


def test_the_object_oracle_ignores_ground_points():
    """A ground sloping by 0.1 m per 1 m cell everywhere, an object in two cells: a side from the ground up, and a
    flat hood 1 m up that hides the ground of its cell (its ground is the neighbours')."""
    pc_range = [-5.0, -5.0, -3.0, 5.0, 5.0, 3.0]
    centres = torch.stack(torch.meshgrid(torch.arange(-4.5, 5.0), torch.arange(-4.5, 5.0), indexing='xy'), -1)
    ground = torch.cat([centres.reshape(-1, 2), (-1.8 + 0.1 * centres[..., :1]).reshape(-1, 1)], 1)
    ground = ground[(ground[:, 0] != 1.5) | (ground[:, 1] != 0.5)]  # the object hides the ground of its cell
    object_points = torch.cat([torch.cat([torch.full((6, 1), x), torch.full((6, 1), 0.5), heights[:, None]], 1)
                               for x, heights in ((0.5, torch.linspace(-1.75, -0.5, 6)),
                                                  (1.5, torch.linspace(-0.8, -0.7, 6)))])
    points = torch.cat([ground, object_points])
    assert lidar_occupancy(points, pc_range, (10, 10)).all(), 'every point counts for the plain oracle'
    occupancy = lidar_occupancy(points, pc_range, (10, 10), min_height=0.3)
    assert torch.nonzero(occupancy).tolist() == [[5, 5], [5, 6]]  # rows along y, columns along x
    assert not lidar_occupancy(ground, pc_range, (10, 10), min_height=0.3).any()
    assert not lidar_occupancy(torch.zeros(0, 3), pc_range, (10, 10), min_height=0.3).any()


def test_oracle_weights_follow_points_in_the_window_and_live_views():
    occupancy = torch.zeros(1, 5, 5, dtype=torch.bool)
    occupancy[0, 0, 0] = True
    info = dict(pts_bev=torch.tensor([[[1, 1], [3, 3], [4, 4]]]),
                pts_pers_idx=torch.tensor([[[0, 0, 0], [1, 0, 0], [-1, -1, -1]]]),
                visible=torch.tensor([[True, True, False]]))
    lidar, camera = oracle_routing_weights(info, occupancy, torch.tensor([[True, False]]), lidar_window=3)
    assert lidar.tolist() == [[1.0, 0.0, 0.0]], 'only the first query has the occupied cell in its 3 x 3 window'
    assert camera.tolist() == [[1.0, 0.0, 0.0]], 'view 1 is dead, the third query is seen by no camera'


def test_a_yawed_view_is_dead_only_when_lies_count(cmt_test_data):
    meta = dict(cmt_test_data['make_img_metas'](1)[0], corruption=dict(mode='view_yaw', yawed_views=[0]))
    cpu = torch.device('cpu')
    assert live_camera_views(meta, 2, cpu).tolist() == [True, True]
    assert live_camera_views(meta, 2, cpu, lies=True).tolist() == [False, True]
    centres = torch.tensor([[10.0, 0.0, 0.0], [-10.0, 0.0, 0.0]])
    lidar2img = stack_lidar2img([meta])[0]
    assert camera_visible_objects(centres, lidar2img, meta).tolist() == [True, True]
    assert camera_visible_objects(centres, lidar2img, meta, lies=True).tolist() == [False, True]


def test_lidar_is_untrusted_where_dropped_misaligned_or_near_a_ghost():
    """A ghost at (6, 2) of 4 m x 2 m: a reference point 1.5 m beside it is near it, one at (-6, 0) is not."""
    queries = torch.tensor([[6.0, 4.5, 0.0], [-6.0, 0.0, 0.0]])
    ghosts = dict(corruption=dict(mode='lidar_ghost', ghost_boxes=[[6.0, 2.0, -1.5, 4.0, 2.0, 1.5, 0.0, 0.0, 0.0]]))
    assert lidar_untrusted(queries, ghosts, lies=True).tolist() == [True, False]
    assert lidar_untrusted(queries, ghosts, lies=False).tolist() == [False, False], 'a ghost lies only with lies'
    misaligned = dict(corruption=dict(mode='lidar_misalign', misaligned=True))
    assert lidar_untrusted(queries, misaligned, lies=True).tolist() == [True, True]
    assert lidar_untrusted(queries, misaligned, lies=False).tolist() == [False, False]
    for dropped in (dict(dropped_modalities=['points']), dict(corruption=dict(mode='lidar_drop'))):
        assert lidar_untrusted(queries, dropped, lies=False).tolist() == [True, True]


def test_unmatched_targets_are_the_oracle_without_untrusted_lidar():
    lidar, camera = torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[0.0, 1.0, 1.0]])
    targets = unmatched_query_targets(lidar, camera, torch.tensor([[False, True, False]]))
    assert targets.tolist() == [[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]]
