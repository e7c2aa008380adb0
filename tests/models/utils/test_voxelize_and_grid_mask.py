"""SPConvVoxelization (spconv 2 on CPU) and GridMask."""
import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.models.utils.grid_mask import GridMask, grid_mask_pattern
from projects.mmdet3d_plugin.models.utils.spconv_voxelize import SPConvVoxelization


def test_voxel_coordinates_are_zyx_indices():
    layer = SPConvVoxelization(voxel_size=[0.5, 0.5, 1.0], point_cloud_range=[0, 0, 0, 4, 4, 2], max_num_points=3,
                               max_voxels=(10, 10), num_point_features=4)
    points = torch.tensor([[0.2, 0.2, 0.2, 1.0], [0.3, 0.1, 0.9, 2.0], [3.9, 1.2, 1.5, 3.0], [9.0, 9.0, 9.0, 4.0]])
    voxels, coords, num_points = layer(points)
    order = coords[:, 2].argsort()
    assert coords[order].tolist() == [[0, 0, 0], [1, 2, 7]]  # (z, y, x); the point outside the range is dropped
    assert num_points[order].tolist() == [2, 1]
    assert voxels.shape == (2, 3, 4) and sorted(voxels[order][0, :2, 3].tolist()) == [1.0, 2.0]
    with pytest.raises(ValueError, match='points'):
        layer(points[:, :3])


def test_grid_mask_only_in_training():
    images = torch.ones(2, 3, 32, 48)
    mask = GridMask(True, True, rotate=1, offset=False, ratio=0.5, mode=1, prob=1.0)
    assert mask.eval()(images) is images
    masked = mask.train()(images)
    assert masked.shape == images.shape and 0 < masked.mean() < 1
    assert set(masked.unique().tolist()) <= {0.0, 1.0}


def test_grid_mask_pattern_stripes():
    pattern = grid_mask_pattern(8, 8, period=4, keep_len=2, offset_h=1, offset_w=0, use_h=True, use_w=False)
    assert np.all(pattern[[1, 2, 5, 6]] == 0) and np.all(pattern[[0, 3, 4, 7]] == 1)
