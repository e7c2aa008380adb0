"""``FeatureModulation``: the legacy way AQR's routing weights reach CMT's decoder, by scaling the features.

``QueryRouter`` applies its weights with the ``AttentionBiasGenerator`` (the
scheme, the head's ``routing=dict(modulation='attention_bias')``: a
cross-attention bias, features unchanged) or, with ``modulation='feature'``
(legacy ablation, SPEC 2.6), with this part: the ``WeightRenderer`` splats the
weights into a BEV map ``[bs, H, W]`` and camera maps ``[bs, N, h, w]`` and
the ``FeatureModulator`` scales the features with them
(``x * w * (1 - r) + x * r``); no bias.

Input: ``lidar_weights`` / ``camera_weights [bs, Q]``, the ``projection_info``
of the queries (``pts_bev [bs, Q, 2]``, ``pts_pers_idx [bs, Q, 3]``,
``visible [bs, Q]``), the memory ``bev_feat [bs, C, H, W]``, ``img_feat
[bs * N, C, h, w]`` and its grids ``(H, W)``, ``(N, h, w)``; output: the two
modulated feature maps, same shapes. Its modules are registered on the head
under the names of :attr:`FeatureModulation.modules`.
"""
from typing import Dict, Optional, Tuple

from mmdet.models.builder import MODELS
from torch import Tensor, nn


class FeatureModulation:
    """The legacy scheme: the routing weights rendered into maps that scale the features; no bias.

    Args:
        weight_renderer_config (dict, optional): ``WeightRenderer`` config (default: its defaults).
        feature_modulator_config (dict, optional): ``FeatureModulator`` config (default: its defaults).
    """

    def __init__(self, weight_renderer_config: Optional[dict] = None,
                 feature_modulator_config: Optional[dict] = None) -> None:
        self.weight_renderer = MODELS.build(weight_renderer_config or dict(type='WeightRenderer'))
        self.feature_modulator = MODELS.build(feature_modulator_config or dict(type='FeatureModulator'))

    @property
    def modules(self) -> Dict[str, nn.Module]:
        """``{name on the head: module}``."""
        return dict(weight_renderer=self.weight_renderer, feature_modulator=self.feature_modulator)

    def __call__(self, lidar_weights: Tensor, camera_weights: Tensor, info: Dict[str, Tensor], bev_feat: Tensor,
                 img_feat: Tensor, bev_shape: Tuple[int, int],
                 camera_shape: Tuple[int, int, int]) -> Tuple[Tensor, Tensor]:
        """The modulated ``bev_feat [bs, C, H, W]`` and ``img_feat [bs * N, C, h, w]`` (see the module docstring)."""
        bev_map, camera_map = self.weight_renderer(lidar_weights, camera_weights, info, bev_shape, camera_shape)
        return self.feature_modulator(bev_feat, bev_map), self.feature_modulator(img_feat, camera_map)
