"""box_frame_offsets: points in the frame of rotated LiDAR boxes."""
import math

import torch

from projects.mmdet3d_plugin.models.utils.box_frame import box_frame_offsets


def test_offsets_are_along_across_and_above_the_bottom_of_each_box():
    boxes = torch.tensor([[1.0, 2.0, -1.0, 4.0, 2.0, 1.5, math.pi / 2], [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]])
    points = torch.tensor([[1.0, 3.0, -0.5], [2.0, 2.0, -1.0]])
    offsets = box_frame_offsets(points, boxes)
    assert offsets.shape == (2, 2, 3)
    torch.testing.assert_close(offsets[:, 0], torch.tensor([[1.0, 0.0, 0.5], [0.0, -1.0, 0.0]]), atol=1e-6, rtol=0)
    torch.testing.assert_close(offsets[:, 1], torch.tensor([[1.0, 3.0, -0.5], [2.0, 2.0, -1.0]]))
    torch.testing.assert_close(box_frame_offsets(points[:, :2], boxes)[..., :2], offsets[..., :2])
