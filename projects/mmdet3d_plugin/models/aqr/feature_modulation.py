"""How AQR's routing weights reach CMT's decoder: as an attention bias (the scheme), or by scaling the features.

``QueryRouter`` applies its weights with one of these parts, chosen by the
head's ``routing=dict(modulation=...)``:

* :class:`BiasModulation` (``'attention_bias'``, default): the
  ``AttentionBiasGenerator`` makes the cross-attention bias; features unchanged.
* :class:`FeatureModulation` (``'feature'``, legacy ablation, SPEC 2.6): the
  ``WeightRenderer`` splats the weights into a BEV map ``[bs, H, W]`` and
  camera maps ``[bs, N, h, w]`` and the ``FeatureModulator`` scales the
  features with them (``x * w * (1 - r) + x * r``); no bias.

Both take ``lidar_weights`` / ``camera_weights [bs, Q]``, the
``projection_info`` of the queries (``pts_bev [bs, Q, 2]``, ``pts_pers_idx
[bs, Q, 3]``, ``visible [bs, Q]``), the memory ``bev_feat [bs, C, H, W]``,
``img_feat [bs * N, C, h, w]`` and the number of DN queries, and return the
memory the decoder attends to: ``(bev_feat, img_feat, cross_attn_bias)``,
the bias over ``[DN + Q, H * W + N * h * w]`` (DN queries: zero bias) or None.
Their modules are registered on the head under the names of :attr:`modules`.
"""
from typing import Dict, NamedTuple, Optional

from mmdet.models.builder import MODELS
from torch import Tensor, nn

from ...attention.per_layer import PerLayer


class ModulatedMemory(NamedTuple):
    """The decoder's memory after routing: features ``[bs, C, H, W]`` / ``[bs * N, C, h, w]`` and the bias."""

    bev_feat: Tensor
    img_feat: Tensor
    cross_attn_bias: object


def memory_shapes(bev_feat: Tensor, img_feat: Tensor):
    """``(H, W)`` of the BEV memory and ``(N, h, w)`` of the camera memory."""
    return tuple(bev_feat.shape[-2:]), (img_feat.size(0) // bev_feat.size(0), *img_feat.shape[-2:])


class BiasModulation:
    """The routing weights as a cross-attention bias (``AttentionBiasGenerator``)."""

    def __init__(self, bias_generator: nn.Module) -> None:
        self.bias_generator = bias_generator

    @property
    def modules(self) -> Dict[str, Optional[nn.Module]]:
        return dict(attention_bias_generator=self.bias_generator)

    def __call__(self, lidar_weights: Tensor, camera_weights: Tensor, info: Dict[str, Tensor], bev_feat: Tensor,
                 img_feat: Tensor, num_dn: int) -> ModulatedMemory:
        bias = self.bias_generator(lidar_weights, camera_weights, info, *memory_shapes(bev_feat, img_feat),
                                   num_dn_queries=num_dn, feature_dtype=bev_feat.dtype)
        return ModulatedMemory(bev_feat, img_feat, PerLayer(bias) if isinstance(bias, list) else bias)


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
    def modules(self) -> Dict[str, Optional[nn.Module]]:
        return dict(attention_bias_generator=None, weight_renderer=self.weight_renderer,
                    feature_modulator=self.feature_modulator)

    def __call__(self, lidar_weights: Tensor, camera_weights: Tensor, info: Dict[str, Tensor], bev_feat: Tensor,
                 img_feat: Tensor, num_dn: int) -> ModulatedMemory:
        bev_map, camera_map = self.weight_renderer(lidar_weights, camera_weights, info,
                                                   *memory_shapes(bev_feat, img_feat))
        return ModulatedMemory(self.feature_modulator(bev_feat, bev_map), self.feature_modulator(img_feat, camera_map),
                               None)
