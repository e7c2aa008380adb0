"""Legacy AQR (ablation): render per-query weights into BEV / camera weight maps."""
from typing import Dict, Optional, Tuple

import torch
from mmcv.runner import BaseModule
from mmdet.models.builder import MODELS
from torch import Tensor

from ...attention.bias.window_cells import check_window_size, window_offsets, window_token_index

KERNELS = ('gaussian', 'window')


@MODELS.register_module()
class WeightRenderer(BaseModule):
    """Splat per-query modality weights onto the feature grids (legacy AQR).

    Every query spreads its weight over a ``window_size`` square around its
    projected cell with kernel ``k(d)``: ``exp(-d^2 / (2 sigma^2))``
    (``'gaussian'``) or 1 (``'window'``), ``d`` the Euclidean distance in
    cells. A cell's value is the kernel-weighted mean of the weights that reach
    it, ``sum_q k_q w_q / sum_q k_q``, and ``background`` where no query
    reaches it. Queries visible in no camera leave the camera maps untouched.
    The maps are differentiable w.r.t. the weights.

    Args:
        kernel (str): ``'gaussian'`` or ``'window'``. Default: ``'gaussian'``.
        window_size (int): odd splat window side in cells. Default: 5.
        sigma (float): Gaussian standard deviation in cells. Default: 1.0.
        background (float): value of cells no query reaches. Default: 1.0
            (no modulation with :class:`FeatureModulator`).
        init_cfg (dict, optional): mmcv initialisation config.
    """

    def __init__(self,
                 kernel: str = 'gaussian',
                 window_size: int = 5,
                 sigma: float = 1.0,
                 background: float = 1.0,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if kernel not in KERNELS:
            raise ValueError(f'kernel must be one of {KERNELS}, got {kernel!r}')
        if sigma <= 0:
            raise ValueError(f'sigma must be positive, got {sigma}')
        self.kernel = kernel
        self.window_size = check_window_size(window_size)
        self.sigma = float(sigma)
        self.background = float(background)

    def _kernel_values(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """``[L]`` kernel value of every window offset."""
        offsets = window_offsets(self.window_size, device).to(dtype)
        if self.kernel == 'window':
            return offsets.new_ones(offsets.shape[0])
        return torch.exp(-offsets.square().sum(-1) / (2 * self.sigma**2))

    def _splat(self, weights: Tensor, index: Tensor, valid: Tensor, num_cells: int) -> Tensor:
        """Kernel-weighted mean of ``weights [bs, Q]`` on ``num_cells`` flat cells -> ``[bs, num_cells]``."""
        bs = weights.shape[0]
        kernel = self._kernel_values(weights.device, weights.dtype) * valid.to(weights.dtype)  # [bs, Q, L]
        numer = weights.new_zeros(bs, num_cells).scatter_add(1, index.flatten(1), (kernel * weights[..., None]).flatten(1))
        denom = weights.new_zeros(bs, num_cells).scatter_add(1, index.flatten(1), kernel.flatten(1))
        covered = denom > 0
        return torch.where(covered, numer / denom.clamp(min=torch.finfo(denom.dtype).tiny),
                           torch.full_like(numer, self.background))

    def render_bev(self, weights: Tensor, pts_bev: Tensor, bev_shape: Tuple[int, int]) -> Tensor:
        """BEV weight map.

        Args:
            weights (Tensor): ``[bs, Q]`` LiDAR weights.
            pts_bev (Tensor): ``[bs, Q, 2]`` long ``(y, x)`` BEV cells.
            bev_shape (tuple[int, int]): ``(H_bev, W_bev)``.

        Returns:
            Tensor: ``[bs, H_bev, W_bev]``.
        """
        index, valid = window_token_index(pts_bev, bev_shape, window_offsets(self.window_size, pts_bev.device))
        height, width = bev_shape
        return self._splat(weights, index, valid, height * width).reshape(-1, height, width)

    def render_camera(self, weights: Tensor, pts_pers_idx: Tensor, visible: Tensor,
                      camera_shape: Tuple[int, int, int]) -> Tensor:
        """Camera weight maps.

        Args:
            weights (Tensor): ``[bs, Q]`` camera weights.
            pts_pers_idx (Tensor): ``[bs, Q, 3]`` long ``(view, h, w)``.
            visible (Tensor): ``[bs, Q]`` bool.
            camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)``.

        Returns:
            Tensor: ``[bs, N, H_img, W_img]``.
        """
        num_views, height, width = camera_shape
        index, valid = window_token_index(pts_pers_idx[..., 1:], (height, width),
                                          window_offsets(self.window_size, pts_pers_idx.device),
                                          center_valid=visible, plane=pts_pers_idx[..., 0].clamp(min=0))
        return self._splat(weights, index, valid, num_views * height * width).reshape(-1, num_views, height, width)

    def forward(self, lidar_weights: Tensor, camera_weights: Tensor, projection_info: Dict[str, Tensor],
                bev_shape: Tuple[int, int], camera_shape: Tuple[int, int, int]) -> Tuple[Tensor, Tensor]:
        """Render both maps.

        Args:
            lidar_weights (Tensor): ``[bs, Q]``.
            camera_weights (Tensor): ``[bs, Q]``.
            projection_info (dict[str, Tensor]): ``pts_bev``, ``pts_pers_idx``, ``visible``.
            bev_shape (tuple[int, int]): ``(H_bev, W_bev)``.
            camera_shape (tuple[int, int, int]): ``(N, H_img, W_img)``.

        Returns:
            tuple[Tensor, Tensor]: ``[bs, H_bev, W_bev]`` and ``[bs, N, H_img, W_img]``.
        """
        bev_map = self.render_bev(lidar_weights, projection_info['pts_bev'], bev_shape)
        camera_map = self.render_camera(camera_weights, projection_info['pts_pers_idx'],
                                        projection_info['visible'], camera_shape)
        return bev_map, camera_map
