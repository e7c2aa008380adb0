"""``PositionEmbedding``: CMT's position embeddings of the BEV tokens, the camera tokens and the queries.

Sizes are always read from the feature maps (``C`` channels, ``bs``
samples, ``N`` views, ``D = depth_num``):

* :meth:`PositionEmbedding.bev`: BEV map ``[bs, C, H, W]`` -> ``[H * W, C]``,
  ``bev_embedding(pos2embed(cell centre))`` (row-major).
* :meth:`PositionEmbedding.frustum`: camera map ``[bs * N, C, h, w]`` ->
  ``[bs * N, h, w, C]``: each cell's frustum (``D`` depths) lifted to LiDAR
  coordinates with ``img2lidar``, normalised by ``pc_range`` and
  embedded by ``rv_embedding`` (``3 * D`` inputs).
* :meth:`PositionEmbedding.token_depth`: depths ``[bs * N, h, w]`` (metres) ->
  ``[bs * N, h, w, C]``, ``bev_embedding(pos2embed(p))`` of each pixel centre
  lifted to its depth, normalised and clamped to ``[0, 1]`` (3DPPE-style,
  ``camera_depth_position``); :meth:`PositionEmbedding.camera` adds it to the frustum's.
* :meth:`PositionEmbedding.queries`: reference points ``[bs, P, 3]``
  (normalised) -> ``[bs, P, C]``, ``bev_embedding(pos2embed(r))`` plus, with a
  camera, the sum over the views that see ``r`` of the ``rv_embedding`` of the
  frustum through its projection.

The camera geometry comes from the forward's :class:`CameraGeometry`. Not an
``nn.Module``: the head registers ``bev_embedding`` / ``rv_embedding`` under
upstream CMT's names; this part holds the geometry.
"""
from typing import Optional, Sequence

import torch
from mmdet.models.utils.transformer import inverse_sigmoid
from torch import Tensor, nn

from ..utils.camera_geometry import CameraGeometry, lift_pixels, project_to_views
from ..utils.image_targets import lift_cell_centres
from ..utils.positional_encoding import (bev_grid_coords, denormalize_points, depth_bins, image_frustum_points,
                                         normalize_points, pos2embed)


class PositionEmbedding:
    """The embeddings of the module docstring.

    Args:
        bev_embedding (nn.Module): ``pos2embed`` features ``[..., 2C]`` -> ``[..., C]``.
        rv_embedding (nn.Module, optional): frustum points ``[..., 3D]`` -> ``[..., C]``; None without a camera.
        pc_range (Sequence[float]): ``(x_min, y_min, z_min, x_max, y_max, z_max)``.
        depth_num (int): depths ``D`` of each frustum.
        hidden_dim (int): ``C``.
    """

    def __init__(self, bev_embedding: nn.Module, rv_embedding: Optional[nn.Module], pc_range: Sequence[float],
                 depth_num: int, hidden_dim: int) -> None:
        self.bev_embedding, self.rv_embedding = bev_embedding, rv_embedding
        self.pc_range, self.depth_num, self.hidden_dim = list(pc_range), depth_num, hidden_dim

    def bev(self, bev_feat: Optional[Tensor]) -> Optional[Tensor]:
        """Embedding ``[H * W, C]`` of the cell centres of ``bev_feat`` ``[bs, C, H, W]`` (None without it)."""
        if bev_feat is None:
            return None
        height, width = bev_feat.shape[-2:]
        return self.bev_embedding(pos2embed(bev_grid_coords(height, width, bev_feat.device), self.hidden_dim))

    def frustum(self, img_feat: Tensor, geometry: CameraGeometry) -> Tensor:
        """``rv_embedding`` of the camera feature cells' frustums, ``[bs * N, h, w, C]``.

        Depends on the features' shape and the geometry (``img2lidar``, ``pad_hw``) only, not on their values.
        """
        bs, num_views = geometry.img2lidar.shape[:2]
        if bs * num_views != img_feat.size(0):
            raise ValueError(f'img_metas describe {bs} samples x {num_views} views but the camera features have '
                             f'{img_feat.size(0)} maps')
        img2lidar = geometry.img2lidar.flatten(0, 1)
        depths = depth_bins(self.depth_num, self.pc_range[3], img_feat.device)
        frustum = image_frustum_points(img_feat.shape[-2:], geometry.pad_hw, depths)
        points = torch.einsum('hwdo,nco->nhwdc', frustum, img2lidar)[..., :3]
        return self.rv_embedding(normalize_points(points, self.pc_range).flatten(-2))

    def token_depth(self, token_depth: Tensor, geometry: CameraGeometry) -> Tensor:
        """``bev_embedding`` of the camera cells' pixel centres lifted to ``token_depth`` ``[bs * N, h, w]``."""
        points = lift_cell_centres(token_depth, geometry.img2lidar.flatten(0, 1), geometry.pad_hw)
        return self.bev_embedding(pos2embed(normalize_points(points, self.pc_range).clamp(0, 1), self.hidden_dim))

    def camera(self, frustum_pos: Tensor, token_depth: Optional[Tensor], geometry: CameraGeometry) -> Tensor:
        """``frustum_pos`` ``[bs * N, h, w, C]`` plus, with ``token_depth``, :meth:`token_depth`."""
        if token_depth is None:
            return frustum_pos
        return frustum_pos + self.token_depth(token_depth, geometry)

    def queries(self, reference_points: Tensor, geometry: Optional[CameraGeometry]) -> Tensor:
        """Embedding ``[bs, P, C]`` of the queries' reference points ``[bs, P, 3]`` (normalised); ``geometry``
        may be None without a camera (no ``rv_embedding``)."""
        reference_points = inverse_sigmoid(reference_points).sigmoid()
        embed = self.bev_embedding(pos2embed(reference_points, self.hidden_dim))
        if self.rv_embedding is not None:
            embed = embed + self.camera_queries(reference_points, geometry)
        return embed

    def camera_queries(self, reference_points: Tensor, geometry: CameraGeometry) -> Tensor:
        """Sum over the views that see each reference point of its frustum embedding, ``[bs, P, C]``."""
        if geometry.batch_size != reference_points.size(0):
            raise ValueError(f'{geometry.batch_size} img_metas for a batch of {reference_points.size(0)}')
        points = denormalize_points(reference_points, self.pc_range)
        image_points, visible = project_to_views(points, geometry.lidar2img, geometry.pad_hw)
        depths = depth_bins(self.depth_num, self.pc_range[3], points.device)
        frustums = lift_pixels(image_points, depths, geometry.img2lidar)
        embeds = self.rv_embedding(normalize_points(frustums, self.pc_range).flatten(-2))
        return (embeds * visible.unsqueeze(-1)).sum(dim=1)
