"""Hard voxelization with spconv 2's ``PointToVoxel``, on the device of the input points."""
from typing import Dict, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn


class SPConvVoxelization(nn.Module):
    """Group points into at most ``max_voxels`` voxels of at most ``max_num_points`` points.

    Not registered (as upstream CMT): ``CmtDetector`` builds it from its
    ``pts_voxel_layer`` config. spconv's generator is bound to one device, so
    one generator is kept per ``(device, max_voxels)`` and created on first
    use: the same module voxelizes CPU and CUDA points, and nothing is moved
    to a GPU behind the caller's back.

    Args:
        voxel_size (Sequence[float]): ``(dx, dy, dz)`` in metres.
        point_cloud_range (Sequence[float]): ``(x_min, y_min, z_min, x_max, y_max, z_max)``.
        max_num_points (int): points kept per voxel.
        max_voxels (int | tuple[int, int]): voxels kept in training and in
            testing mode (one int for both).
        num_point_features (int): values per point (x, y, z, intensity, ...).
    """

    def __init__(self, voxel_size: Sequence[float], point_cloud_range: Sequence[float], max_num_points: int,
                 max_voxels: Union[int, Tuple[int, int]], num_point_features: int) -> None:
        super().__init__()
        if len(voxel_size) != 3:
            raise ValueError(f'voxel_size must have 3 values, got {voxel_size}')
        if len(point_cloud_range) != 6:
            raise ValueError(f'point_cloud_range must have 6 values, got {point_cloud_range}')
        self.voxel_size = [float(v) for v in voxel_size]
        self.point_cloud_range = [float(v) for v in point_cloud_range]
        self.max_num_points = int(max_num_points)
        self.max_voxels = tuple(max_voxels) if isinstance(max_voxels, (tuple, list)) else (max_voxels, max_voxels)
        if len(self.max_voxels) != 2:
            raise ValueError(f'max_voxels must be an int or (train, test), got {max_voxels}')
        self.num_point_features = int(num_point_features)
        extent = np.array(self.point_cloud_range[3:]) - np.array(self.point_cloud_range[:3])
        self.grid_size = np.round(extent / np.array(self.voxel_size)).astype(np.int64)
        self._generators: Dict[Tuple[str, int], object] = {}

    def _generator(self, device: torch.device, max_voxels: int):
        key = (str(device), max_voxels)
        if key not in self._generators:
            try:
                from spconv.pytorch.utils import PointToVoxel
            except ImportError as error:
                raise ImportError('SPConvVoxelization needs spconv 2.x (pip install spconv, or spconv-cu1xx on '
                                  'CUDA machines)') from error
            self._generators[key] = PointToVoxel(
                vsize_xyz=self.voxel_size,
                coors_range_xyz=self.point_cloud_range,
                num_point_features=self.num_point_features,
                max_num_voxels=max_voxels,
                max_num_points_per_voxel=self.max_num_points,
                device=device)
        return self._generators[key]

    @torch.no_grad()
    def forward(self, points: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Voxelize one point cloud.

        Args:
            points (Tensor): ``[P, num_point_features]``.

        Returns:
            tuple[Tensor, Tensor, Tensor]:
                - voxels ``[M, max_num_points, num_point_features]`` (zero padded),
                - coordinates ``[M, 3]`` int32 ``(z, y, x)`` voxel indices,
                - num_points ``[M]`` int32 points per voxel.
        """
        if points.dim() != 2 or points.size(1) != self.num_point_features:
            raise ValueError(f'SPConvVoxelization expects points [P, {self.num_point_features}], got '
                             f'{tuple(points.shape)}')
        max_voxels = self.max_voxels[0] if self.training else self.max_voxels[1]
        generator = self._generator(points.device, max_voxels)
        voxels, coordinates, num_points = generator(points.float().contiguous())
        # spconv reuses its output buffers between calls
        return voxels.clone(), coordinates.clone(), num_points.clone()

    def extra_repr(self) -> str:
        return (f'voxel_size={self.voxel_size}, point_cloud_range={self.point_cloud_range}, '
                f'max_num_points={self.max_num_points}, max_voxels={self.max_voxels}, '
                f'num_point_features={self.num_point_features}')
