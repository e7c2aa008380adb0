"""``QueryRouter``: Adaptive Query Routing (AQR) inside CMT's head: per-query modality weights -> an attention bias.

Turning a CMT config into CMT-AQR means adding to its ``CmtHead``::

    aqr_config=dict(type='AQRWeightGenerator', window_sizes=[15, 5]),
    attention_bias_config=dict(type='AttentionBiasGenerator', window_size=15, bias_scale=1.0,
                               use_local_bias=True, fp16=True),

which the head's config upgrade moves into its ``routing`` sub-config. Data flow of :meth:`QueryRouter.route`
(``bs`` samples, ``P = DN + Q`` queries, ``C`` channels)::

    reference_points [bs, P, 3] (normalised), query_embed [bs, P, C]  (the Q matching queries are routed)
    + bev_feat [bs, C, H, W], bev_pos [H * W, C], img_feat [bs * N, C, h, w], rv_pos [bs * N, h, w, C],
      CameraGeometry (lidar2img [bs, N, 4, 4], image sizes [bs, N, 2]), img_metas
      -> AQRWeightGenerator -> lidar_weights, camera_weights [bs, Q], projection_info
         (pts_bev [bs, Q, 2], pts_idx [bs, Q], pts_pers_idx [bs, Q, 3], visible [bs, Q])
      -> AttentionBiasGenerator -> AttentionBias (or PerLayer of them) over
         [DN queries ; Q] x [BEV keys ; camera keys] (DN queries: zero bias), features unchanged
         or, legacy (modulation='feature'), FeatureModulation -> modulated features, no bias
    -> (DecoderMemory with the bias, QueryRouting)

Without ``aqr_config`` the router is off (plain CMT). ``test_cfg['aqr_routing'] = 'oracle'`` (or
``'oracle_objects'``, ``'oracle_lies'``) replaces the learned weights at test time by the input's truth
(:data:`ORACLE_TRUTHS`): the headroom routing could add. New parameters live under ``aqr_weight_generator.``
and ``attention_bias_generator.`` (:attr:`QueryRouter.modules`): a CMT checkpoint loads with only those missing.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
from mmdet.models.builder import MODELS
from torch import Tensor, nn

from ..aqr.bias_generator import AttentionBiasGenerator
from ..aqr.feature_modulation import FeatureModulation
from ..aqr.routing_targets import (OBJECT_MIN_HEIGHT, lidar_occupancy, lidar_untrusted, live_camera_views,
                                   oracle_routing_weights, unmatched_query_targets)
from ..utils.camera_geometry import CameraGeometry
from ..utils.img_meta_keys import LIDAR_POINTS_KEY
from ..utils.positional_encoding import denormalize_points
from .pass_plan import DecoderMemory

MODULATIONS = ('attention_bias', 'feature')


@dataclass(frozen=True)
class OracleTruth:
    """What an oracle routing takes for the input's truth (:func:`oracle_routing_weights`: LiDAR 1 where a query's
    BEV window holds points, camera 1 where a live view sees its reference point).

    Attributes:
        min_height (float, optional): height above the local ground from which a point counts (None: every point).
        lies (bool): a yawed view is no live view, and the LiDAR is 0 where it lies (misaligned, or a ghost
            within ``GHOST_MARGIN_M`` of the query: :func:`lidar_untrusted`).
    """

    min_height: Optional[float] = None
    lies: bool = False


#: The oracle routings of ``test_cfg['aqr_routing']``.
ORACLE_TRUTHS = dict(oracle=OracleTruth(), oracle_objects=OracleTruth(OBJECT_MIN_HEIGHT),
                     oracle_lies=OracleTruth(OBJECT_MIN_HEIGHT, lies=True))
#: ``test_cfg['aqr_routing']``: the router's weights, or one of the oracles' truths.
TEST_ROUTINGS = ('learned', *ORACLE_TRUTHS)


def routing_mode(test_cfg: Optional[dict], owner: str = 'CmtHead') -> str:
    """``test_cfg['aqr_routing']``: ``'learned'`` (default) or an oracle (:data:`ORACLE_TRUTHS`)."""
    routing = (test_cfg or {}).get('aqr_routing', 'learned')
    if routing not in TEST_ROUTINGS:
        raise ValueError(f"{owner}: test_cfg['aqr_routing'] must be one of {TEST_ROUTINGS}, got {routing!r}")
    return routing


@dataclass
class QueryRouting:
    """What AQR decided for the matching queries of a batch.

    Attributes:
        lidar_weights (Tensor): ``[bs, Q]`` trust in LiDAR, in ``[0, 1]``.
        camera_weights (Tensor): ``[bs, Q]`` trust in the camera, in ``[0, 1]``.
        projection_info (dict[str, Tensor]): ``pts_bev``, ``pts_idx``,
            ``pts_pers_idx``, ``visible`` (see ``project_reference_points``).
        img_metas (Sequence[dict]): the batch's metas (``dropped_modalities``
            feeds the auxiliary routing loss).
        geometry (CameraGeometry): the batch's cameras (the per-query routing loss projects with them).
        unmatched_targets (Tensor, optional): ``[bs, Q, 2]`` the input's truth at each query's reference point,
            computed in training when the unmatched queries get routing targets (``unmatched_loss_weight``).
    """

    lidar_weights: Tensor
    camera_weights: Tensor
    projection_info: Dict[str, Tensor]
    img_metas: Sequence[dict]
    geometry: CameraGeometry
    unmatched_targets: Optional[Tensor] = None


def routing_of(outputs) -> Optional[QueryRouting]:
    """The :class:`QueryRouting` of a head's outputs (``HeadOutputs.routing``; None without AQR)."""
    return outputs.routing


class QueryRouter:
    """AQR's weight generator and the part that applies its weights (see the module docstring).

    Not an ``nn.Module``: the head registers :attr:`modules` under the names
    published checkpoints use; the router holds the logic.

    Args:
        weight_generator (nn.Module, optional): ``AQRWeightGenerator``; None: routing off.
        bias_generator (AttentionBiasGenerator, optional): makes the
            cross-attention bias of the weights (``modulation='attention_bias'``).
        feature_modulation (FeatureModulation, optional): scales the features
            by the weights instead (legacy ``modulation='feature'``).
        pc_range (Sequence[float]): the head's point-cloud range.
    """

    def __init__(self, weight_generator: Optional[nn.Module] = None,
                 bias_generator: Optional[AttentionBiasGenerator] = None,
                 feature_modulation: Optional[FeatureModulation] = None, pc_range: Sequence[float] = ()) -> None:
        self.weight_generator, self.pc_range = weight_generator, list(pc_range)
        self.bias_generator, self.feature_modulation = bias_generator, feature_modulation

    @classmethod
    def build(cls, routing: Optional[dict], hidden_dim: int, decoder: nn.Module, fusion: bool,
              pc_range: Sequence[float], head_name: str = 'CmtHead') -> 'QueryRouter':
        """The router of a head's ``routing`` sub-config.

        Args:
            routing (dict, optional): ``aqr_config`` (``AQRWeightGenerator``
                config, ``embed_dims`` defaults to ``hidden_dim``; None: off),
                ``attention_bias_config`` (``AttentionBiasGenerator`` config,
                ``num_heads`` / ``num_layers`` default to the decoder's),
                ``modulation`` (:data:`MODULATIONS`), and for ``'feature'``
                ``weight_renderer_config`` / ``feature_modulator_config``.
            hidden_dim (int): the head's width.
            decoder (nn.Module): the head's ``PETRTransformerDecoder``.
            fusion (bool): whether the head has both modalities (AQR needs them).
            pc_range (Sequence[float]): the head's point-cloud range.
            head_name (str): for the error messages.
        """
        options = dict(routing or {})
        aqr_config, bias_config = options.pop('aqr_config', None), options.pop('attention_bias_config', None)
        modulation = options.pop('modulation', 'attention_bias')
        renderer, modulator = options.pop('weight_renderer_config', None), options.pop('feature_modulator_config', None)
        if options:
            raise TypeError(f'{head_name}: unknown routing options {sorted(options)}')
        if modulation not in MODULATIONS:
            raise ValueError(f'{head_name}: modulation must be one of {MODULATIONS}, got {modulation!r}')
        if aqr_config is None:
            if bias_config is not None or renderer is not None or modulator is not None:
                raise ValueError(f'{head_name}: attention_bias_config / weight_renderer_config / '
                                 f'feature_modulator_config need aqr_config (the AQRWeightGenerator that makes the '
                                 f'weights they use)')
            return cls(pc_range=pc_range)
        if not fusion:
            raise ValueError(f'{head_name}: AQR routes queries between LiDAR and camera; it needs a fusion head '
                             f'(CmtHead)')
        weight_generator = MODELS.build(dict(dict(embed_dims=hidden_dim), **aqr_config))
        if modulation == 'feature':
            if bias_config is not None:
                raise ValueError(f"{head_name}: attention_bias_config is unused with modulation='feature'; remove it "
                                 f"or set modulation='attention_bias'")
            return cls(weight_generator, feature_modulation=FeatureModulation(renderer, modulator), pc_range=pc_range)
        if bias_config is None:
            raise ValueError(f"{head_name}: modulation='attention_bias' needs attention_bias_config, e.g. "
                             f"dict(type='AttentionBiasGenerator', window_size=15, bias_scale=1.0)")
        if renderer is not None or modulator is not None:
            raise ValueError(f"{head_name}: weight_renderer_config / feature_modulator_config belong to "
                             f"modulation='feature', not 'attention_bias'")
        defaults = dict(num_heads=decoder.layers[0].attentions[1].num_heads, num_layers=len(decoder.layers))
        return cls(weight_generator, MODELS.build(dict(defaults, **bias_config)), pc_range=pc_range)

    @property
    def enabled(self) -> bool:
        """Whether AQR runs."""
        return self.weight_generator is not None

    @property
    def modulates_features(self) -> bool:
        """Whether the weights scale the features (legacy ``modulation='feature'``) instead of biasing the attention."""
        return self.feature_modulation is not None

    @property
    def modules(self) -> Dict[str, Optional[nn.Module]]:
        """``{name on the head: module}`` in the order they were built (None: absent)."""
        modules = dict(aqr_weight_generator=self.weight_generator, attention_bias_generator=self.bias_generator)
        return dict(modules, **(self.feature_modulation.modules if self.modulates_features else {}))

    def oracle_routing(self, test_cfg: Optional[dict], owner: str = 'CmtHead') -> Optional[str]:
        """The oracle routing that replaces the learned weights in testing (``test_cfg['aqr_routing']``), or None."""
        routing = routing_mode(test_cfg, owner)
        return routing if self.enabled and routing in ORACLE_TRUTHS else None

    def uses_oracle(self, test_cfg: Optional[dict], owner: str = 'CmtHead') -> bool:
        """Whether testing replaces the learned weights by the input's truth (``test_cfg['aqr_routing']``)."""
        return self.oracle_routing(test_cfg, owner) is not None

    @property
    def needs_gt_point_counts(self) -> bool:
        """Whether :meth:`loss` needs ``gt_num_points`` (the per-query routing loss is on)."""
        return self.enabled and self.weight_generator.with_query_targets

    @property
    def needs_points_in_train_metas(self) -> bool:
        """Whether training needs each sample's points in its img_meta (the unmatched queries' LiDAR truth)."""
        return self.enabled and self.weight_generator.with_unmatched_targets

    def route(self, reference_points: Tensor, query_embed: Tensor, memory: DecoderMemory, img_metas: Sequence[dict],
              geometry: CameraGeometry, num_dn: int, oracle: Optional[str] = None
              ) -> Tuple[DecoderMemory, Optional[QueryRouting]]:
        """Route the matching queries (the last ``P - num_dn``) and return what the decoder gets.

        Args:
            reference_points (Tensor): ``[bs, P, 3]`` normalised, DN queries first.
            query_embed (Tensor): ``[bs, P, C]``.
            memory (DecoderMemory): the fused pass's tokens and positions (no bias yet).
            img_metas (Sequence[dict]): ``dropped_modalities`` (and ``lidar_points``
                and the dead views for the oracle and the unmatched queries' targets).
            geometry (CameraGeometry): the batch's cameras (:meth:`CameraGeometry.from_metas`).
            num_dn (int): DN queries at the front.
            oracle (str, optional): an oracle routing (a key of :data:`ORACLE_TRUTHS`): the input's truth
                instead of the learned weights.

        Returns:
            tuple[DecoderMemory, QueryRouting | None]: the memory with the
            bias (or the legacy scheme's features) and the routing.
        """
        if not self.enabled:
            return memory, None
        bev_feat, img_feat = memory.bev_feat, memory.img_feat
        lidar_weights, camera_weights, info = self.weight_generator(
            query_embed[:, num_dn:], reference_points[:, num_dn:], bev_feat, img_feat, geometry, self.pc_range,
            bev_pos=memory.bev_pos, img_pos=memory.rv_pos)
        bev_shape, camera_shape = memory.grid_shapes()
        if oracle:
            truth = ORACLE_TRUTHS[oracle]
            lidar_weights, camera_weights = self._oracle_weights(info, bev_shape, camera_shape[0], img_metas,
                                                                 truth.min_height, truth.lies)
            if truth.lies:
                untrusted = self._lidar_untrusted(reference_points[:, num_dn:], img_metas, lies=True)
                lidar_weights = lidar_weights.masked_fill(untrusted, 0.0)
        routing = QueryRouting(lidar_weights, camera_weights, info, img_metas, geometry)
        if self.weight_generator.training and self.weight_generator.with_unmatched_targets:
            lies = self.weight_generator.lie_targets
            oracle_lidar, oracle_camera = self._oracle_weights(info, bev_shape, camera_shape[0], img_metas, None, lies)
            untrusted = self._lidar_untrusted(reference_points[:, num_dn:], img_metas, lies)
            routing.unmatched_targets = unmatched_query_targets(oracle_lidar, oracle_camera, untrusted)
        if self.modulates_features:
            bev_feat, img_feat = self.feature_modulation(lidar_weights, camera_weights, info, bev_feat, img_feat,
                                                         bev_shape, camera_shape)
            return memory._replace(bev_feat=bev_feat, img_feat=img_feat), routing
        bias = self.bias_generator(lidar_weights, camera_weights, info, bev_shape, camera_shape, num_dn_queries=num_dn,
                                   feature_dtype=bev_feat.dtype)
        return memory._replace(cross_attn_bias=bias), routing

    def _lidar_untrusted(self, reference_points: Tensor, img_metas: Sequence[dict], lies: bool) -> Tensor:
        """``[bs, Q]`` bool: where each sample's LiDAR gives a query (normalised ``[bs, Q, 3]``) no truth."""
        reference_xyz = denormalize_points(reference_points.detach(), self.pc_range)
        return torch.stack([lidar_untrusted(xyz, meta, lies) for xyz, meta in zip(reference_xyz, img_metas)])

    def _oracle_weights(self, info: Dict[str, Tensor], bev_shape: Tuple[int, int], num_views: int,
                        img_metas: Sequence[dict], min_height: Optional[float],
                        lies: bool = False) -> Tuple[Tensor, Tensor]:
        """The oracle's ``lidar`` / ``camera`` weights ``[bs, Q]`` (see ``models/aqr/routing_targets.py``; with
        ``lies`` a yawed view is no live view)."""
        device = info['pts_bev'].device
        occupancy, live = [], []
        for index, meta in enumerate(img_metas):
            if LIDAR_POINTS_KEY not in meta:
                raise KeyError(f"img_metas[{index}] has no '{LIDAR_POINTS_KEY}': the oracle and the unmatched "
                               f"queries' targets read the sample's LiDAR points there (CmtDetector puts them when "
                               f"the head asks)")
            occupancy.append(lidar_occupancy(meta[LIDAR_POINTS_KEY].to(device), self.pc_range, bev_shape,
                                             min_height))
            live.append(live_camera_views(meta, num_views, device, lies))
        return oracle_routing_weights(info, torch.stack(occupancy), torch.stack(live),
                                      self.weight_generator.lidar_window)

    def loss(self, routing: Optional[QueryRouting], matched_objects: Optional[Sequence[Sequence[Tensor]]],
             gt_bboxes_3d: Sequence, gt_num_points: Optional[Sequence[Tensor]],
             head_name: str = 'CmtHead') -> Dict[str, Tensor]:
        """AQR's routing losses: the per-sample one (``aux_loss_weight``) and the per-query one (``query_loss_weight``).

        Args:
            routing (QueryRouting, optional): what the forward decided (None without AQR).
            matched_objects: per sample, per task ``[Q]`` the matched object (see ``DetectionLoss``).
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample.
            gt_num_points (Sequence[Tensor], optional): per sample ``[n]`` LiDAR points in each box.
            head_name (str): for the error messages.
        """
        if routing is None:
            return {}
        generator = self.weight_generator
        losses = generator.loss(routing.lidar_weights, routing.camera_weights, routing.img_metas)
        if generator.with_query_targets:
            if gt_num_points is None:
                raise ValueError(f'{head_name}: AQR query_loss_weight > 0 needs gt_num_points (the LiDAR points in '
                                 f'each ground-truth box; CmtDetector.forward_train counts them)')
            centres = [boxes.gravity_center.to(routing.lidar_weights.device) for boxes in gt_bboxes_3d]
            losses.update(generator.query_loss(routing.lidar_weights, routing.camera_weights, matched_objects,
                                               centres, gt_num_points, routing.img_metas, routing.geometry,
                                               routing.unmatched_targets))
        return losses
