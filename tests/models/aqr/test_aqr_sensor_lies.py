"""Where the sensors lie: ghost boxes moved as the training pipeline moved the scene, yawed views, misalignment,
the BEV neighbourhood of a box."""
import math

import numpy as np
import pytest
import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from mmdet3d.core.points import LiDARPoints

import projects.mmdet3d_plugin  # noqa: F401
from projects.mmdet3d_plugin.datasets.pipelines.global_rot_scale_trans import GlobalRotScaleTransAll
from projects.mmdet3d_plugin.datasets.pipelines.random_flip_3d import CustomRandomFlip3D
from projects.mmdet3d_plugin.models.aqr.sensor_lies import (ghost_boxes, lidar_misaligned, near_boxes,
                                                              yawed_views)

GHOSTS = [[6.0, 2.0, -1.5, 4.0, 2.0, 1.5, 0.3, 1.0, 0.5], [-8.0, -3.0, -1.2, 1.0, 1.0, 1.8, -2.0, 0.0, 0.0]]


@pytest.mark.parametrize('flips', [(False, False), (True, False), (False, True), (True, True)])
def test_ghost_boxes_follow_the_3d_augmentation_of_the_scene(flips):
    """The record keeps the boxes where the corruption put them; the model must see them where the augmented
    scene has their points, i.e. where the same boxes as a box field of the pipeline end up."""
    np.random.seed(3)
    as_field = LiDARInstance3DBoxes(torch.tensor(GHOSTS), box_dim=9)
    results = dict(points=LiDARPoints(torch.zeros(1, 4), points_dim=4), gt_bboxes_3d=as_field,
                   bbox3d_fields=['gt_bboxes_3d'], corruption=dict(ghost_boxes=GHOSTS),
                   pcd_horizontal_flip=flips[0], pcd_vertical_flip=flips[1])
    results = GlobalRotScaleTransAll(rot_range=0.7, scale_ratio_range=(0.9, 1.1), translation_std=0.5)(results)
    results = CustomRandomFlip3D()(results)
    assert results['pcd_scale_factor'] != 1.0 and results['pcd_rotation_angle'] != 0.0
    moved = ghost_boxes(results, torch.device('cpu'))
    assert moved.shape == (2, 7)
    assert torch.allclose(moved, results['gt_bboxes_3d'].tensor[:, :7], atol=1e-5)
    assert not torch.allclose(moved, torch.tensor(GHOSTS)[:, :7], atol=0.1), 'the augmentation moved them'


def test_ghost_boxes_of_a_sample_without_ghosts_or_augmentation():
    assert ghost_boxes({}, torch.device('cpu')).shape == (0, 7)
    assert ghost_boxes(dict(corruption=dict(mode='lidar_ghost', ghost_boxes=[])), torch.device('cpu')).shape == (0, 7)
    unmoved = ghost_boxes(dict(corruption=dict(ghost_boxes=GHOSTS)), torch.device('cpu'))
    assert torch.equal(unmoved, torch.tensor(GHOSTS)[:, :7])
    with pytest.raises(KeyError, match='pcd_rotation'):
        ghost_boxes(dict(corruption=dict(ghost_boxes=GHOSTS), transformation_3d_flow=['R']), torch.device('cpu'))
    with pytest.raises(ValueError, match='unknown transformation_3d_flow step'):
        ghost_boxes(dict(corruption=dict(ghost_boxes=GHOSTS), transformation_3d_flow=['X']), torch.device('cpu'))


def test_yawed_views_and_misalignment_are_read_from_the_record():
    assert yawed_views({}) == [] and yawed_views(dict(corruption=dict(yawed_views=[1, 4]))) == [1, 4]
    assert not lidar_misaligned({}) and not lidar_misaligned(dict(corruption=dict(misaligned=False)))
    assert lidar_misaligned(dict(corruption=dict(mode='lidar_misalign', misaligned=True)))


def test_near_boxes_is_the_box_grown_by_the_margin_in_bev():
    """A 4 m x 2 m box turned by 90 degrees: 2 m along x, 4 m along y."""
    box = torch.tensor([[0.0, 0.0, -1.0, 4.0, 2.0, 1.5, math.pi / 2]])
    points = torch.tensor([[0.0, 3.9, 0.0], [0.0, 4.1, 0.0], [2.9, 0.0, 0.0], [3.1, 0.0, 0.0], [0.0, 0.0, 9.0]])
    assert near_boxes(points, box, margin=2.0).tolist() == [True, False, True, False, True], 'height is ignored'
    assert near_boxes(points, box, margin=0.0).tolist() == [False, False, False, False, True]
    assert not near_boxes(points, box[:0]).any()
    with pytest.raises(ValueError, match='boxes must be'):
        near_boxes(points, box[:, :6])
