"""Adaptive Query Routing (AQR) inside CMT's head.

Turning a CMT config into CMT-AQR means adding to its ``CmtHead``::

    aqr_config=dict(type='AQRWeightGenerator', window_sizes=[15, 5]),
    attention_bias_config=dict(type='AttentionBiasGenerator', window_size=15, bias_scale=1.0,
                               use_local_bias=True, fp16=True),

The design notes' switch ``enable_aqr`` is accepted too: ``True`` requires
``aqr_config``, ``False`` builds plain CMT even when the AQR dicts are present
(logged). Their other names (``models/aqr/design_note_keys.py``: the legacy modules'
``renderer_config`` / ``modulator_config``, ``aqr_bias_strength``,
``aqr_use_local_bias``) are rejected with the keys to use here.

Data flow of one forward pass (``modulation='attention_bias'``, the default)::

    reference points, query pos. embeddings (matching queries, no DN)
        + BEV / camera memory and their position embeddings + img_metas
      -> AQRWeightGenerator -> lidar_weights, camera_weights [bs, Q], projection_info
      -> AttentionBiasGenerator -> AttentionBias over [DN queries ; Q] x [BEV keys ; camera keys]
         (DN queries: zero bias)
      -> CmtTransformer -> every PETRTransformerDecoderLayer's cross-attention (attn_masks[1])
      -> PETRMultiheadFlashAttention -> apply_attention (a backend that applies it exactly)

The features themselves are never changed. The legacy scheme
(``modulation='feature'``) instead renders the weights into BEV / camera
weight maps (``WeightRenderer``) and scales the features with them
(``FeatureModulator``); no bias reaches the attention.

The new parameters live under ``aqr_weight_generator.`` and
``attention_bias_generator.``, so a CMT checkpoint loads into CMT-AQR with
only those reported missing.
"""
import logging
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from mmdet.models.builder import MODELS
from torch import Tensor

from ...attention import AttentionBias
from ..aqr.routing_targets import live_camera_views, lidar_occupancy, oracle_routing_weights
from ..utils.denoising import DenoisingQueries
from ..utils.petr_transformer import PerLayer
from .modality_passes import LIDAR_POINTS_KEY

MODULATIONS = ('attention_bias', 'feature')
#: ``test_cfg['aqr_routing']``: the router's weights, or the input's truth (:func:`oracle_routing_weights`).
TEST_ROUTINGS = ('learned', 'oracle')
logger = logging.getLogger('mmdet')


@dataclass
class QueryRouting:
    """What AQR decided for the matching queries of a batch.

    A plain (non-iterable) record, so mmcv's ``force_fp32`` passes it through
    the prediction dicts unchanged.

    Attributes:
        lidar_weights (Tensor): ``[bs, Q]`` trust in LiDAR, in ``[0, 1]``.
        camera_weights (Tensor): ``[bs, Q]`` trust in the camera, in ``[0, 1]``.
        projection_info (dict[str, Tensor]): ``pts_bev``, ``pts_idx``,
            ``pts_pers_idx``, ``visible`` (see ``project_reference_points``).
        img_metas (Sequence[dict]): the batch's metas (``dropped_modalities``
            feeds the auxiliary routing loss).
    """

    lidar_weights: Tensor
    camera_weights: Tensor
    projection_info: Dict[str, Tensor]
    img_metas: Sequence[dict]


class RoutedInputs(NamedTuple):
    """The decoder inputs after routing: features (modulated only by the legacy scheme) and the bias."""

    bev_feat: Optional[Tensor]
    img_feat: Optional[Tensor]
    cross_attn_bias: Union[None, AttentionBias, PerLayer]
    routing: Optional[QueryRouting]


class AQRRoutingMixin:
    """Builds the AQR modules of a fusion head and routes its queries.

    The host head provides ``hidden_dim``, ``pc_range``, ``transformer``,
    ``uses_lidar``, ``uses_camera`` and ``test_cfg``. ``test_cfg['aqr_routing'] =
    'oracle'`` replaces the learned weights at test time by the input's truth
    (LiDAR 1 where a query's BEV window holds points, camera 1 where a live view
    sees its reference point): the headroom routing could add.
    """

    def init_query_routing(self,
                           aqr_config: Optional[dict],
                           attention_bias_config: Optional[dict],
                           modulation: str = 'attention_bias',
                           weight_renderer_config: Optional[dict] = None,
                           feature_modulator_config: Optional[dict] = None,
                           enable_aqr: Optional[bool] = None) -> None:
        """Build the AQR modules (none when ``aqr_config`` is None or ``enable_aqr`` is False: plain CMT).

        Args:
            aqr_config (dict, optional): ``AQRWeightGenerator`` config;
                ``embed_dims`` defaults to the head's ``hidden_dim``.
            attention_bias_config (dict, optional): ``AttentionBiasGenerator``
                config (needed with ``modulation='attention_bias'``);
                ``num_heads`` / ``num_layers`` default to the decoder's.
            modulation (str): ``'attention_bias'`` or ``'feature'`` (legacy).
            weight_renderer_config (dict, optional): ``WeightRenderer`` config
                for ``modulation='feature'``.
            feature_modulator_config (dict, optional): ``FeatureModulator``
                config for ``modulation='feature'``.
            enable_aqr (bool, optional): the design notes' switch. None: AQR
                iff ``aqr_config`` is given; True: AQR, ``aqr_config``
                required; False: plain CMT, the AQR configs are not built
                (logged).
        """
        name = type(self).__name__
        if enable_aqr not in (None, True, False):
            raise ValueError(f'{name}: enable_aqr must be True, False or None, got {enable_aqr!r}')
        if enable_aqr and aqr_config is None:
            raise ValueError(f"{name}: enable_aqr=True needs aqr_config, e.g. dict(type='AQRWeightGenerator', "
                             f"window_sizes=[15, 5])")
        if enable_aqr is False:
            configs = dict(aqr_config=aqr_config, attention_bias_config=attention_bias_config,
                           weight_renderer_config=weight_renderer_config,
                           feature_modulator_config=feature_modulator_config)
            present = [key for key, value in configs.items() if value is not None]
            if present:
                logger.info(f'{name}: enable_aqr=False, so {", ".join(present)} are not built: plain CMT')
            aqr_config = attention_bias_config = weight_renderer_config = feature_modulator_config = None
        if modulation not in MODULATIONS:
            raise ValueError(f'{name}: modulation must be one of {MODULATIONS}, got {modulation!r}')
        self.modulation = modulation
        self.aqr_weight_generator = None
        self.attention_bias_generator = None
        if aqr_config is None:
            if attention_bias_config is not None or weight_renderer_config is not None \
                    or feature_modulator_config is not None:
                raise ValueError(f'{name}: attention_bias_config / weight_renderer_config / '
                                 f'feature_modulator_config need aqr_config (the AQRWeightGenerator that makes the '
                                 f'weights they use)')
            return
        if not (self.uses_lidar and self.uses_camera):
            raise ValueError(f'{name}: AQR routes queries between LiDAR and camera; it needs a fusion head (CmtHead)')
        self.aqr_weight_generator = MODELS.build(dict(dict(embed_dims=self.hidden_dim), **aqr_config))
        if modulation == 'attention_bias':
            if attention_bias_config is None:
                raise ValueError(f"{name}: modulation='attention_bias' needs attention_bias_config, e.g. "
                                 f"dict(type='AttentionBiasGenerator', window_size=15, bias_scale=1.0)")
            if weight_renderer_config is not None or feature_modulator_config is not None:
                raise ValueError(f"{name}: weight_renderer_config / feature_modulator_config belong to "
                                 f"modulation='feature', not 'attention_bias'")
            decoder = self.transformer.decoder
            defaults = dict(num_heads=decoder.layers[0].attentions[1].num_heads, num_layers=len(decoder.layers))
            self.attention_bias_generator = MODELS.build(dict(defaults, **attention_bias_config))
        else:
            if attention_bias_config is not None:
                raise ValueError(f"{name}: attention_bias_config is unused with modulation='feature'; remove it or "
                                 f"set modulation='attention_bias'")
            self.weight_renderer = MODELS.build(weight_renderer_config or dict(type='WeightRenderer'))
            self.feature_modulator = MODELS.build(feature_modulator_config or dict(type='FeatureModulator'))

    @property
    def with_query_routing(self) -> bool:
        """Whether this head runs AQR."""
        return self.aqr_weight_generator is not None

    def route_queries(self, reference_points: Tensor, query_embed: Tensor, bev_feat: Optional[Tensor],
                      bev_pos: Optional[Tensor], img_feat: Optional[Tensor], rv_pos: Optional[Tensor],
                      img_metas: Sequence[dict], dn_queries: Optional[DenoisingQueries]) -> RoutedInputs:
        """Run AQR on the matching queries and return what the decoder gets.

        Args:
            reference_points (Tensor): ``[bs, P, 3]`` normalised; the first
                ``dn_queries.pad_size`` rows (if any) are DN queries.
            query_embed (Tensor): ``[bs, P, C]`` query positional embeddings.
            bev_feat (Tensor, optional): ``[bs, C, H, W]`` BEV memory.
            bev_pos (Tensor, optional): ``[H * W, C]``.
            img_feat (Tensor, optional): ``[bs * N, C, h, w]`` camera memory.
            rv_pos (Tensor, optional): ``[bs * N, h, w, C]``.
            img_metas (Sequence[dict]): ``lidar2img``, ``img_shape``, ``pad_shape``.
            dn_queries (DenoisingQueries, optional): the DN part of the queries.

        Returns:
            RoutedInputs: features, the cross-attention bias (an
            ``AttentionBias``, a ``PerLayer`` of them, or None) and the routing.
        """
        if not self.with_query_routing:
            return RoutedInputs(bev_feat, img_feat, None, None)
        num_dn = dn_queries.pad_size if dn_queries is not None else 0
        lidar_weights, camera_weights, info = self.aqr_weight_generator(
            query_embed[:, num_dn:], reference_points[:, num_dn:], bev_feat, img_feat, img_metas, self.pc_range,
            bev_pos=bev_pos, img_pos=rv_pos)
        bev_shape = tuple(bev_feat.shape[-2:])
        camera_shape = (img_feat.size(0) // bev_feat.size(0), *img_feat.shape[-2:])
        if not self.training and self.test_routing == 'oracle':
            lidar_weights, camera_weights = self._oracle_weights(info, bev_shape, camera_shape[0], img_metas)
        routing = QueryRouting(lidar_weights, camera_weights, info, img_metas)
        if self.modulation == 'feature':
            bev_map, camera_map = self.weight_renderer(lidar_weights, camera_weights, info, bev_shape, camera_shape)
            return RoutedInputs(self.feature_modulator(bev_feat, bev_map), self.feature_modulator(img_feat, camera_map),
                                None, routing)
        bias = self.attention_bias_generator(lidar_weights, camera_weights, info, bev_shape, camera_shape,
                                             num_dn_queries=num_dn, feature_dtype=bev_feat.dtype)
        return RoutedInputs(bev_feat, img_feat, PerLayer(bias) if isinstance(bias, list) else bias, routing)

    @property
    def test_routing(self) -> str:
        """``test_cfg['aqr_routing']``: ``'learned'`` (default) or ``'oracle'`` (evaluation of routing headroom)."""
        routing = (self.test_cfg or {}).get('aqr_routing', 'learned')
        if routing not in TEST_ROUTINGS:
            raise ValueError(f"{type(self).__name__}: test_cfg['aqr_routing'] must be one of {TEST_ROUTINGS}, "
                             f"got {routing!r}")
        return routing

    @property
    def needs_points_in_metas(self) -> bool:
        """Whether the detector must put each sample's points in its img_meta at test time (oracle routing)."""
        return self.with_query_routing and self.test_routing == 'oracle'

    def _oracle_weights(self, info: Dict[str, Tensor], bev_shape: Tuple[int, int], num_views: int,
                        img_metas: Sequence[dict]) -> Tuple[Tensor, Tensor]:
        """The oracle's ``lidar`` / ``camera`` weights ``[bs, Q]`` (see ``models/aqr/routing_targets.py``)."""
        device = info['pts_bev'].device
        occupancy, live = [], []
        for index, meta in enumerate(img_metas):
            if LIDAR_POINTS_KEY not in meta:
                raise KeyError(f"img_metas[{index}] has no '{LIDAR_POINTS_KEY}': oracle routing reads the sample's "
                               f"LiDAR points there (CmtDetector.simple_test puts them when the head asks)")
            occupancy.append(lidar_occupancy(meta[LIDAR_POINTS_KEY].to(device), self.pc_range, bev_shape))
            live.append(live_camera_views(meta, num_views, device))
        return oracle_routing_weights(info, torch.stack(occupancy), torch.stack(live),
                                      self.aqr_weight_generator.lidar_window)

    @property
    def needs_gt_point_counts(self) -> bool:
        """Whether ``loss`` needs ``gt_num_points`` (AQR's per-query routing loss is on)."""
        return self.with_query_routing and self.aqr_weight_generator.with_query_targets

    def routing_loss(self, routing: Optional[QueryRouting], matched_objects: Optional[Sequence[Sequence[Tensor]]],
                     gt_bboxes_3d: Sequence, gt_num_points: Optional[Sequence[Tensor]]) -> Dict[str, Tensor]:
        """AQR's routing losses: the per-sample one (``aux_loss_weight``) and the per-query one (``query_loss_weight``).

        Args:
            routing (QueryRouting, optional): what the forward decided (None without AQR).
            matched_objects: per sample, per task ``[Q]`` the matched object (see ``CmtHeadLossMixin.loss``).
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample.
            gt_num_points (Sequence[Tensor], optional): per sample ``[n]`` LiDAR points in each box.
        """
        if routing is None:
            return {}
        generator = self.aqr_weight_generator
        losses = generator.loss(routing.lidar_weights, routing.camera_weights, routing.img_metas)
        if generator.with_query_targets:
            if gt_num_points is None:
                raise ValueError(f'{type(self).__name__}: AQR query_loss_weight > 0 needs gt_num_points (the LiDAR '
                                 f'points in each ground-truth box; CmtDetector.forward_train counts them)')
            centres = [boxes.gravity_center.to(routing.lidar_weights.device) for boxes in gt_bboxes_3d]
            losses.update(generator.query_loss(routing.lidar_weights, routing.camera_weights, matched_objects,
                                               centres, gt_num_points, routing.img_metas))
        return losses


def routing_of(preds_dicts: Sequence[List[dict]]) -> Optional[QueryRouting]:
    """The :class:`QueryRouting` a head stored in its predictions (None without AQR)."""
    return preds_dicts[0][0].get('aqr_routing')
