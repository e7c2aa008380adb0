"""2D targets of 3D boxes on a constructed camera: centre heatmaps, object depths, clipping, lifting."""
import numpy as np
import torch
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from mmdet3d.core.utils.gaussian import gaussian_radius as mmdet3d_gaussian_radius

from projects.mmdet3d_plugin.models.utils.camera_geometry import invert_lidar2img, project_to_views
from projects.mmdet3d_plugin.models.utils.image_targets import (centre_heatmap_targets, gaussian_radius,
                                                                 lift_cell_centres, object_depth_targets,
                                                                 project_box_centres, project_box_extents)

PAD_HW = (40.0, 80.0)
FEAT_HW = (4, 8)  # stride 10 px
FOCAL, MIN_DEPTH = 20.0, 0.1


def front_camera() -> torch.Tensor:
    """``[1, 4, 4]`` lidar2img of a camera at the origin looking along +x (right = -y, down = -z)."""
    lidar2cam = np.eye(4)
    lidar2cam[:3, :3] = [[0, -1, 0], [0, 0, -1], [1, 0, 0]]
    intrinsic = np.eye(4)
    intrinsic[:3, :3] = [[FOCAL, 0, PAD_HW[1] / 2], [0, FOCAL, PAD_HW[0] / 2], [0, 0, 1]]
    return torch.tensor(intrinsic @ lidar2cam, dtype=torch.float32)[None]


def boxes(*rows) -> LiDARInstance3DBoxes:
    """Boxes from ``(x, y, gravity z, w, l, h)`` rows (yaw 0)."""
    tensor = torch.tensor([[x, y, z - h / 2, w, l, h, 0.0] for x, y, z, w, l, h in rows], dtype=torch.float32)
    return LiDARInstance3DBoxes(tensor.reshape(-1, 7))


def targets(gt: LiDARInstance3DBoxes, labels, num_classes=3):
    lidar2img = front_camera()
    pixels, depth, visible = project_box_centres(gt.gravity_center, lidar2img, PAD_HW, MIN_DEPTH)
    extents, valid = project_box_extents(gt.corners, lidar2img, PAD_HW, MIN_DEPTH)
    heatmap = centre_heatmap_targets(pixels, extents, visible, torch.tensor(labels), num_classes, FEAT_HW, PAD_HW)
    depth_target, covered = object_depth_targets(extents, depth, valid & (depth > MIN_DEPTH), FEAT_HW, PAD_HW)
    return dict(pixels=pixels, depth=depth, visible=visible, extents=extents, valid=valid, heatmap=heatmap,
                depth_target=depth_target, covered=covered)


def test_centre_lands_in_its_cell_with_peak_one():
    # centre 10 m ahead, 1 m left and 0.5 m up: u = 40 - 20 * 1 / 10 = 38, v = 20 - 20 * 0.5 / 10 = 19
    out = targets(boxes((10.0, 1.0, 0.5, 1.0, 1.0, 1.0)), [2])
    torch.testing.assert_close(out['pixels'][0, 0], torch.tensor([38.0, 19.0]))
    torch.testing.assert_close(out['depth'], torch.tensor([[10.0]]))
    heatmap = out['heatmap'][0]
    assert heatmap.shape == (3, 4, 8)
    assert heatmap[2, 1, 3] == 1 and (heatmap == 1).sum() == 1  # cell (row 19 // 10, column 38 // 10)
    assert heatmap[:2].abs().sum() == 0, 'other classes get nothing'
    assert 0 < heatmap[2, 1, 2] < 1 and 0 < heatmap[2, 2, 3] < 1, 'a Gaussian around the peak'


def test_box_behind_the_camera_gives_no_target():
    out = targets(boxes((-10.0, 0.0, 0.0, 2.0, 2.0, 2.0)), [0])
    assert not out['visible'].any() and not out['valid'].any()
    assert out['heatmap'].abs().sum() == 0
    assert not out['covered'].any()


def test_nearer_object_wins_where_boxes_overlap():
    # a 4 m box 8 m ahead in front of a 40 m wide one 16 m ahead, both on the optical axis
    out = targets(boxes((8.0, 0.0, 0.0, 4.0, 4.0, 4.0), (16.0, 0.0, 0.0, 1.0, 40.0, 12.0)), [0, 1])
    near_x1, near_y1, near_x2, near_y2 = out['extents'][0, 0].tolist()
    far_x1, _, far_x2, _ = out['extents'][0, 1].tolist()
    assert far_x1 < near_x1 and near_x2 < far_x2
    centre_cell = out['depth_target'][0, 1:3, 3:5]  # cell centres (35..45, 15..25) lie in the near box
    assert near_x1 < 35 and near_x2 > 45 and near_y1 < 15 and near_y2 > 25
    torch.testing.assert_close(centre_cell, torch.full((2, 2), 8.0))
    assert out['depth_target'][0, 1, 2] == 16.0 and out['covered'][0, 1, 2], 'left of the near box: the far one'
    assert not out['covered'][0, 0, 0], 'outside both boxes: no depth target'
    assert out['heatmap'][0, 0].max() == 1 and out['heatmap'][0, 1].max() == 1


def test_boxes_are_clipped_to_the_image_border():
    # first centre at u = 40 + 20 * 19 / 10 = 78 (inside), its box reaching beyond u = 80; second centre at u = 100
    out = targets(boxes((10.0, -19.0, 0.0, 6.0, 6.0, 6.0), (10.0, -30.0, 0.0, 30.0, 30.0, 2.0)), [0, 1])
    assert out['visible'].tolist() == [[True, False]], 'the second centre is outside the image'
    assert out['valid'].tolist() == [[True, True]], 'but part of its box is inside'
    x1, y1, x2, y2 = out['extents'][0, 0].tolist()
    assert x2 == PAD_HW[1] and 0 < x1 < PAD_HW[1] and 0 <= y1 < y2 <= PAD_HW[0]
    assert out['covered'][0, 1:3, -1].all(), 'cells at the border are covered'
    assert out['depth_target'][0, 1, -1] == 10.0
    assert out['heatmap'][0, 1].abs().sum() == 0, 'no heatmap for a centre outside the image'
    assert out['heatmap'][0, 0].max() == 1


def test_gaussian_radius_equals_mmdet3d_per_box():
    heights, widths = torch.tensor([1.0, 3.0, 7.5]), torch.tensor([2.0, 3.0, 1.5])
    expected = torch.stack([mmdet3d_gaussian_radius((h, w), 0.1) for h, w in zip(heights, widths)])
    torch.testing.assert_close(gaussian_radius(heights, widths, 0.1), expected)


def test_lifted_cell_centres_project_back_to_the_centres_at_their_depth():
    lidar2img = front_camera()
    depth = torch.rand(1, *FEAT_HW) * 20 + 1
    points = lift_cell_centres(depth, invert_lidar2img(lidar2img), PAD_HW)
    assert points.shape == (1, 4, 8, 3)
    torch.testing.assert_close(points[..., 0], depth)  # the camera looks along +x
    image_points, visible = project_to_views(points.reshape(1, -1, 3), lidar2img[None], PAD_HW)
    assert visible.all()
    u = (torch.arange(8) + 0.5) * 10
    v = (torch.arange(4) + 0.5) * 10
    torch.testing.assert_close(image_points[0, 0, :, :2].reshape(4, 8, 2)[..., 0], u.expand(4, 8))
    torch.testing.assert_close(image_points[0, 0, :, :2].reshape(4, 8, 2)[..., 1], v[:, None].expand(4, 8))
