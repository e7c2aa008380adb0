"""``BatchPillarScatter``: mmdet3d's ``PointPillarsScatter`` for a batch in one indexed write, without a host sync.

mmdet3d's ``PointPillarsScatter.forward_batch`` selects each sample's pillars
with a boolean mask (``voxel_features[coors[:, 0] == i]``). The forward runs
inside the detector's ``permitted_host_sync`` region (voxelization), but the
backward of a boolean-mask index is an ``index_put`` that turns the mask into
indices (``nonzero``): on CUDA the host waits for the device there, twice per
batch of two, in every training step. Here every pillar is written to its cell
of the whole batch's canvas at once, through integer indices: the output is
the same tensor (values, shape, memory layout) and its backward is a gather.
"""
from typing import Optional, Sequence

import torch
from mmcv.runner import auto_fp16
from mmdet3d.models.builder import MIDDLE_ENCODERS
from torch import Tensor, nn


@MIDDLE_ENCODERS.register_module()
class BatchPillarScatter(nn.Module):
    """Scatter pillar features onto a dense BEV canvas, the whole batch in one write.

    A drop-in for mmdet3d's ``PointPillarsScatter`` (same arguments, same
    output, no parameters): configs switch by the ``type`` alone.

    Args:
        in_channels (int): ``C``, channels of the pillar features.
        output_shape (Sequence[int]): ``(ny, nx)``, the canvas' rows and columns.
    """

    def __init__(self, in_channels: int, output_shape: Sequence[int]) -> None:
        super().__init__()
        if len(output_shape) != 2:
            raise ValueError(f'output_shape must be (ny, nx), got {list(output_shape)}')
        self.in_channels = in_channels
        self.output_shape = list(output_shape)
        self.ny, self.nx = self.output_shape
        self.fp16_enabled = False

    @auto_fp16(apply_to=('voxel_features', ))
    def forward(self, voxel_features: Tensor, coors: Tensor, batch_size: Optional[int] = None) -> Tensor:
        """The batch's BEV canvas.

        Args:
            voxel_features (Tensor): ``[M, C]`` one feature vector per pillar.
            coors (Tensor): ``[M, 4]`` ``(sample, z, y, x)`` of each pillar, at most one pillar per cell.
            batch_size (int, optional): samples of the batch (default 1: every pillar in sample 0, as
                ``PointPillarsScatter.forward_single``).

        Returns:
            Tensor: ``[batch_size, C, ny, nx]``, zero where no pillar is.
        """
        if voxel_features.dim() != 2 or voxel_features.shape[1] != self.in_channels:
            raise ValueError(f'voxel_features must be [M, {self.in_channels}], got {list(voxel_features.shape)}')
        if coors.shape != (len(voxel_features), 4):
            raise ValueError(f'coors must be [M, 4] = [{len(voxel_features)}, 4], got {list(coors.shape)}')
        if batch_size is None:
            batch_size, sample = 1, torch.zeros_like(coors[:, 0], dtype=torch.long)
        else:
            sample = coors[:, 0].long()
        cell = coors[:, 2].long() * self.nx + coors[:, 3].long()
        canvas = voxel_features.new_zeros(batch_size, self.in_channels, self.ny * self.nx)
        canvas[sample, :, cell] = voxel_features
        return canvas.view(batch_size, self.in_channels, self.ny, self.nx)
