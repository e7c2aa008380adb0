"""Legacy AQR (ablation): scale feature maps by rendered weight maps."""
from typing import Optional

from mmcv.runner import BaseModule
from mmdet.models.builder import MODELS
from torch import Tensor


@MODELS.register_module()
class FeatureModulator(BaseModule):
    """``x' = x * w * (1 - r) + x * r`` with ``w`` a weight map and ``r`` the residual ratio.

    This is the old AQR scheme, kept for ablations (``modulation='feature'``):
    unlike the attention bias it changes the feature values the decoder sees.

    Args:
        residual_ratio (float): ``r`` in ``[0, 1]``; 1 leaves the features
            unchanged. Default: 0.5.
        init_cfg (dict, optional): mmcv initialisation config.
    """

    def __init__(self, residual_ratio: float = 0.5, init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if not 0.0 <= residual_ratio <= 1.0:
            raise ValueError(f'residual_ratio must be in [0, 1], got {residual_ratio}')
        self.residual_ratio = float(residual_ratio)

    def forward(self, features: Tensor, weight_map: Tensor) -> Tensor:
        """Modulate a feature map.

        Args:
            features (Tensor): ``[B, C, H, W]`` (BEV ``B = bs``; camera ``B = bs * N``).
            weight_map (Tensor): ``[B, H, W]``, or ``[bs, N, H, W]`` for camera
                features (flattened to ``[bs * N, H, W]``).

        Returns:
            Tensor: ``[B, C, H, W]``.
        """
        if weight_map.dim() == 4:
            weight_map = weight_map.flatten(0, 1)
        expected = (features.shape[0], *features.shape[2:])
        if features.dim() != 4 or tuple(weight_map.shape) != expected:
            raise ValueError(f'weight_map {tuple(weight_map.shape)} does not match features '
                             f'{tuple(features.shape)} (expected {expected})')
        scale = weight_map.to(features.dtype) * (1.0 - self.residual_ratio) + self.residual_ratio
        return features * scale[:, None]
