"""CMT's detection head: a thin orchestrator of explicit parts, each built from one sub-config.

``CmtHead`` decodes ``num_query`` learned anchor queries (plus denoising queries in training) against its
memory of tokens and turns the decoder's outputs into per-task box predictions. Its parts:

* :class:`PassPlan` (``passes``): the head's tokens (``modalities``) and its decoding passes, with each pass's
  keys, decoder and bias;
* :class:`QueryRouter` (``routing``): AQR's per-query modality weights -> an ``AttentionBias``;
* ``aids``: the learning aids, :class:`CameraAids` (the image aux head, depth-aware camera positions, the camera
  window prior, black camera views for the fused pass) and the BEV memory's :class:`BevAuxHead` (``bev_aux_config``);
* :class:`PositionEmbedding`: the BEV, camera and query position embeddings;
* :class:`DetectionLoss` (``losses``, ``denoising``): matched focal + L1 losses and the DN losses of every pass.

Data flow of :meth:`CmtHead.forward` (``bs`` samples, ``C = hidden_dim``, ``P = DN + Q`` queries, ``L`` layers)::

    pts_feats[0] [bs, in_channels, H, W] -> shared_conv -> [bs, C, H, W] ; img_feats[0] [bs * N, C, h, w]
    img_metas -> CameraGeometry (lidar2img and inverse [bs, N, 4, 4], image sizes), read once for all parts
    -> queries: reference points [bs, P, 3], query_embed [bs, P, C]
    -> CameraAids.cameras -> camera memory and positions [bs * N, h, w, C]
    -> QueryRouter.route -> DecoderMemory with the cross-attention bias over [P, H * W + N * h * w]
    -> per pass: PassPlan.memory_of -> transformer -> [L, bs, P, C] -> task heads
    -> HeadOutputs (per task center, height, dim, rot, vel, cls_logits [L, bs, Q, .]; routing; passes; aux)

Parameter names (``shared_conv``, ``transformer``, ``reference_points``, ``bev_embedding``, ``rv_embedding``,
``task_heads``) and the regression layout equal upstream CMT's, so published checkpoints load.
"""
import copy
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from mmcv.cnn import ConvModule
from mmcv.runner import BaseModule, ModuleList, force_fp32
from mmdet.core import build_bbox_coder
from mmdet.models.builder import HEADS, build_head
from mmdet.models.utils import build_transformer
from mmdet.models.utils.transformer import inverse_sigmoid
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from torch import Tensor, nn

from ...attention import AttentionBias
from ...config_upgrade import current_keys_only, register_legacy_types
from ...utils.host_data import device_constant, host_to_device
from ..utils.camera_blanking import FusedBlankViews
from ..utils.camera_geometry import CameraGeometry
from ..utils.denoising import DenoisingConfig, DenoisingQueries
from .bev_aux_head import BEV_AUX_PREFIX
from .camera_aids import CameraAids
from .cmt_head_loss import DetectionLoss
from .head_outputs import HeadOutputs, PassOutputs, TaskPredictions, fp32_predictions
from .pass_plan import FUSED, DecoderMemory, ModalityPass, PassPlan, merge_sample_predictions, trained_samples
from .position_embedding import PositionEmbedding
from .query_router import QueryRouter

NUSCENES_TASKS = (
    dict(num_class=1, class_names=['car']),
    dict(num_class=2, class_names=['truck', 'construction_vehicle']),
    dict(num_class=2, class_names=['bus', 'trailer']),
    dict(num_class=1, class_names=['barrier']),
    dict(num_class=2, class_names=['motorcycle', 'bicycle']),
    dict(num_class=2, class_names=['pedestrian', 'traffic_cone']),
)
REGRESSION_HEADS = dict(center=(2, 2), height=(1, 2), dim=(3, 2), rot=(2, 2), vel=(2, 2))
TASK_HEADS = dict(tasks=NUSCENES_TASKS, common_heads=REGRESSION_HEADS,
                  separate_head=dict(type='SeparateTaskHead', init_bias=-2.19, final_kernel=1))
LOSSES = dict(loss_cls=dict(type='FocalLoss', use_sigmoid=True, reduction='mean', gamma=2, alpha=0.25, loss_weight=1.0),
              loss_bbox=dict(type='L1Loss', reduction='mean', loss_weight=0.25))


@HEADS.register_module()
@current_keys_only
class CmtHead(BaseModule):
    """CMT's head (see the module docstring); takes its options grouped (``config_upgrade`` groups flat ones).

    The parts' own modules are registered on the head as ``aqr_weight_generator``, ``attention_bias_generator``,
    ``separate_decoders`` and ``image_aux_head``. Outputs follow upstream CMT's
    regression layout: per query the branches ``center (2), height (1), dim (3), rot (2), vel (2)`` are
    concatenated into one 10-value code compared with :func:`normalize_bbox`'s
    ``(cx, cy, log w, log l, cz, log h, sin, cos, vx, vy)``. ``center`` and ``height`` are decoded to metres
    (sigmoid around the reference point); so the third slot, named ``height`` upstream, is the one trained
    against ``log w`` (and ``dim``'s second value against ``cz``). Published checkpoints were trained with this
    layout, and :class:`MultiTaskBBoxCoder` decodes it the same way.

    Args:
        in_channels (int): channels of the BEV feature map (before ``shared_conv``).
        num_query (int): learned anchor queries Q.
        hidden_dim (int): transformer width C.
        depth_num (int): depths of each camera frustum (``rv_embedding`` takes ``3 * depth_num`` inputs).
        downsample_scale (int): BEV feature stride in voxels. When the
            train/test config has ``grid_size``, the BEV map must be
            ``grid_size[:2] // downsample_scale``, else a ``ValueError`` names the mismatch.
        task_heads (dict, optional): ``tasks`` (``dict(num_class, class_names)``
            per task head; their classes, in order, are the global classes),
            ``common_heads`` (regression branches ``name -> (channels, num_conv)``)
            and ``separate_head`` (``SeparateTaskHead`` config); defaults: nuScenes' CMT.
        transformer (dict): ``CmtTransformer`` config (its decoder's ``num_layers`` sets the task heads' groups).
        bbox_coder (dict): ``MultiTaskBBoxCoder`` config; its ``pc_range`` is the head's.
        losses (dict, optional): ``loss_cls`` (sigmoid focal) and ``loss_bbox`` (L1) configs.
        denoising (dict, optional): :class:`DenoisingConfig` (``scalar``,
            ``noise_scale``, ``noise_trans``, ``split``, ``dn_weight``).
        routing (dict, optional): :meth:`QueryRouter.build`'s sub-config
            (``aqr_config``, ``attention_bias_config``, ``modulation``, ...);
            None: plain CMT, same outputs and state dict.
        passes (dict, optional): :class:`PassPlan` (``modalities``,
            ``modality_passes``, ``pass_decoders``, ``lidar_free_pass``, ``camera_free_pass``).
        aids (dict, optional): the learning aids: :class:`CameraAids`'s options (``image_aux_config``,
            ``camera_depth_position``, ``camera_window_prior``, ``fused_image_drop_prob``) and ``bev_aux_config``,
            a :class:`BevAuxHead` config (its ``in_channels``, ``num_classes`` and ``pc_range`` come from the
            head) trained on the BEV memory.
        train_cfg (dict, optional): ``assigner``, ``code_weights`` (10 values), ``grid_size``.
        test_cfg (dict, optional): ``grid_size``, ``aqr_routing`` (``'learned'`` or an oracle of
            ``query_router.ORACLE_TRUTHS``).
    """

    def __init__(self,
                 in_channels: int,
                 num_query: int = 900,
                 hidden_dim: int = 128,
                 depth_num: int = 64,
                 downsample_scale: int = 8,
                 task_heads: Optional[dict] = None,
                 transformer: Optional[dict] = None,
                 bbox_coder: Optional[dict] = None,
                 losses: Optional[dict] = None,
                 denoising: Optional[dict] = None,
                 routing: Optional[dict] = None,
                 passes: Optional[dict] = None,
                 aids: Optional[dict] = None,
                 train_cfg: Optional[dict] = None,
                 test_cfg: Optional[dict] = None) -> None:
        name = type(self).__name__
        if transformer is None or bbox_coder is None:
            raise ValueError(f'{name} needs a transformer and a bbox_coder config')
        super().__init__(init_cfg=None)
        task_heads = dict(TASK_HEADS, **(task_heads or {}))
        self.num_classes = [len(task['class_names']) for task in task_heads['tasks']]
        for task in task_heads['tasks']:
            if task.get('num_class', len(task['class_names'])) != len(task['class_names']):
                raise ValueError(f'task {task}: num_class differs from the number of class_names')
        self.class_names = [list(task['class_names']) for task in task_heads['tasks']]
        self.hidden_dim, self.num_query, self.in_channels = hidden_dim, num_query, in_channels
        self.depth_num, self.downsample_scale = depth_num, downsample_scale
        self.train_cfg, self.test_cfg, self.fp16_enabled = train_cfg, test_cfg, False
        self.denoising = DenoisingConfig(**(denoising or {}))
        self.pass_plan = PassPlan(**(passes or {}), head_name=name)
        self.detection_loss = DetectionLoss(self.num_classes, train_cfg=train_cfg, denoising=self.denoising,
                                            head_name=name, **dict(LOSSES, **(losses or {})))
        self.bbox_coder = build_bbox_coder(bbox_coder)
        self.pc_range = list(self.bbox_coder.pc_range)
        if self.bbox_coder.num_classes != sum(self.num_classes):
            raise ValueError(f'bbox_coder.num_classes={self.bbox_coder.num_classes} but the tasks have '
                             f'{sum(self.num_classes)} classes')
        if self.pass_plan.uses_lidar:
            self.shared_conv = ConvModule(in_channels, hidden_dim, kernel_size=3, padding=1,
                                          conv_cfg=dict(type='Conv2d'), norm_cfg=dict(type='BN2d'))
        self.transformer = build_transformer(transformer)
        if self.transformer.embed_dims != hidden_dim:
            raise ValueError(f'transformer width {self.transformer.embed_dims} differs from hidden_dim {hidden_dim}')
        self.reference_points = nn.Embedding(num_query, 3)
        self.bev_embedding = nn.Sequential(
            nn.Linear(hidden_dim * 2, hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, hidden_dim))
        if self.pass_plan.uses_camera:
            self.rv_embedding = nn.Sequential(
                nn.Linear(depth_num * 3, hidden_dim * 4), nn.ReLU(inplace=True), nn.Linear(hidden_dim * 4, hidden_dim))
        self.positions = PositionEmbedding(self.bev_embedding, getattr(self, 'rv_embedding', None), self.pc_range,
                                           depth_num, hidden_dim)
        self.task_heads = self._build_task_heads(task_heads)
        self.separate_decoders = self.pass_plan.build_separate_decoders(
            lambda: (build_transformer(transformer), self._build_task_heads(task_heads)))
        self.router = QueryRouter.build(routing, hidden_dim, self.transformer.decoder, self.pass_plan.fusion,
                                        self.pc_range, name)
        self._register(self.router.modules)
        camera_aids = dict(aids or {})
        bev_aux_config = camera_aids.pop('bev_aux_config', None)
        self.camera_aids = CameraAids(**camera_aids, hidden_dim=hidden_dim, num_classes=sum(self.num_classes),
                                      pass_plan=self.pass_plan, pc_range=self.pc_range,
                                      modulates_features=self.router.modulates_features, head_name=name)
        self._register(self.camera_aids.modules)
        self.bev_aux_head = self._build_bev_aux_head(bev_aux_config)

    def _build_bev_aux_head(self, bev_aux_config: Optional[dict] = None) -> Optional[nn.Module]:
        if bev_aux_config is None:
            return None
        if not self.pass_plan.uses_lidar:
            raise ValueError(f'{type(self).__name__} has no BEV memory: aids.bev_aux_config needs a head '
                             f'with LiDAR tokens')
        return build_head(dict(bev_aux_config, in_channels=self.hidden_dim, num_classes=sum(self.num_classes),
                               pc_range=self.pc_range))

    def _register(self, modules: Dict[str, Optional[nn.Module]]) -> None:
        """Register a part's modules on the head under the names checkpoints use (None: an absent module)."""
        for name, module in modules.items():
            setattr(self, name, module)

    def _build_task_heads(self, task_heads: dict) -> ModuleList:
        """One ``SeparateTaskHead`` per task, its groups one per decoder layer (mmcv's ``ModuleList``, so that
        ``init_weights()`` reaches them and sets the classification prior)."""
        heads = ModuleList()
        for num_cls in self.num_classes:
            branches = dict(copy.deepcopy(task_heads['common_heads']), cls_logits=(num_cls, 2))
            heads.append(build_head(dict(task_heads['separate_head'], in_channels=self.hidden_dim, heads=branches,
                                         groups=len(self.transformer.decoder.layers))))
        return heads

    @property
    def with_query_routing(self) -> bool:
        """Whether this head runs AQR."""
        return self.router.enabled

    @property
    def needs_points_in_metas(self) -> bool:
        """Whether the detector must put each sample's points in its img_meta at test time (oracle routing, or
        ``lidar_free_pass`` telling the samples without LiDAR)."""
        return self.router.uses_oracle(self.test_cfg, type(self).__name__) or self.pass_plan.needs_points_in_metas

    @property
    def needs_blank_views_in_metas(self) -> bool:
        """Whether the detector must put, at test time, which camera images are blank in each img_meta
        (``camera_free_pass`` telling the samples without cameras)."""
        return self.pass_plan.needs_blank_views_in_metas

    @property
    def needs_gt_point_counts(self) -> bool:
        """Whether ``loss`` needs ``gt_num_points`` (AQR's per-query routing loss is on)."""
        return self.router.needs_gt_point_counts

    @property
    def needs_points_in_train_metas(self) -> bool:
        """Whether the detector must put each sample's points in its img_meta in training (AQR's unmatched
        queries' routing targets)."""
        return self.router.needs_points_in_train_metas

    @property
    def fused_image_drop_prob(self) -> float:
        return self.camera_aids.fused_image_drop_prob

    def draw_fused_image_drops(self, img_metas: Sequence[dict]) -> Tuple[bool, ...]:
        """Per training sample, whether its fused pass sees black camera views (see :class:`CameraAids`)."""
        return self.camera_aids.draw_fused_image_drops(img_metas)

    def init_weights(self) -> None:
        """Children's initialisation, then anchor reference points uniform in ``[0, 1]^3``."""
        super().init_weights()
        nn.init.uniform_(self.reference_points.weight, 0, 1)

    # ------------------------------------------------------------------ forward
    def forward(self,
                pts_feats: Sequence[Optional[Tensor]],
                img_feats: Sequence[Optional[Tensor]],
                img_metas: Sequence[dict],
                gt_bboxes_3d: Optional[Sequence[LiDARInstance3DBoxes]] = None,
                gt_labels_3d: Optional[Sequence[Tensor]] = None,
                fused_blank_views: Optional[FusedBlankViews] = None) -> HeadOutputs:
        """Decode the queries into per-task predictions.

        Only the first (finest) level of ``pts_feats`` and ``img_feats`` is used.

        Args:
            pts_feats (Sequence[Tensor | None]): BEV maps ``[bs, in_channels, H, W]``.
            img_feats (Sequence[Tensor | None]): camera maps ``[bs * N, C, h, w]``.
            img_metas (Sequence[dict]): one dict per sample.
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes], optional): boxes with
                velocity; in training mode they make the DN queries.
            gt_labels_3d (Sequence[Tensor], optional): global class indices.
            fused_blank_views (FusedBlankViews, optional): in training with
                ``fused_image_drop_prob``, the samples whose fused pass and
                routing see black camera views, and those views' features.

        Returns:
            HeadOutputs: the fused pass's predictions (see
            :mod:`.head_outputs`); in training also the DN queries, the
            single-modality passes' and the aux head's outputs; at inference
            with ``lidar_free_pass`` / ``camera_free_pass`` the samples
            without LiDAR points / with blank cameras hold that pass's predictions.
        """
        bev_feat, img_feat = self._features(pts_feats, img_feats, img_metas, fused_blank_views)
        reference_points, self_attn_mask, dn_queries = self._queries(len(img_metas), gt_bboxes_3d, gt_labels_3d)
        geometry = CameraGeometry.from_metas(img_metas, img_feat.device) if img_feat is not None else None
        query_embed = self.positions.queries(reference_points, geometry)
        cameras = self.camera_aids.cameras(img_feat, img_metas, geometry, fused_blank_views, self.positions,
                                           self.training)
        memory = DecoderMemory(bev_feat, self.positions.bev(bev_feat), cameras.fused_img_feat, cameras.fused_rv_pos)
        num_dn = reference_points.size(1) - self.num_query
        oracle = None if self.training else self.router.oracle_routing(self.test_cfg, type(self).__name__)
        fused, routing = self.router.route(reference_points, query_embed, memory, cameras.fused_metas, geometry,
                                           num_dn, oracle)
        prior = self.camera_aids.window_prior_bias(reference_points, img_feat, geometry)

        def decode(modality_pass, pass_memory) -> TaskPredictions:
            return self._decode_pass(modality_pass, pass_memory, reference_points, query_embed, self_attn_mask,
                                     num_dn, prior)

        tasks = decode(FUSED, fused)
        if self.training:
            passes = {modality_pass.name: PassOutputs(decode(modality_pass, cameras.single_modality(fused)),
                                                      trained_samples(modality_pass, img_metas))
                      for modality_pass in self.pass_plan.passes[1:]}
            bev_aux = self.bev_aux_head(bev_feat, img_metas) if self.bev_aux_head is not None else None
            return HeadOutputs(tasks, dn_queries, routing, passes, cameras.image_aux, cameras.fused_black_samples,
                               bev_aux)
        fused_samples = [True] * len(img_metas)
        for modality_pass, samples in self.pass_plan.inference_passes(img_metas)[1:]:
            tasks = merge_sample_predictions(tasks, decode(modality_pass, fused),
                                             host_to_device(samples, reference_points.device))
            fused_samples = [kept and not taken for kept, taken in zip(fused_samples, samples)]
        bev_aux = None
        if self.bev_aux_head is not None and self.bev_aux_head.runs_at_inference:
            bev_aux = dataclasses.replace(self.bev_aux_head(bev_feat, img_metas), trained=tuple(fused_samples))
        return HeadOutputs(tasks, routing=routing, bev_aux=bev_aux)

    def _features(self, pts_feats: Sequence[Optional[Tensor]], img_feats: Sequence[Optional[Tensor]],
                  img_metas: Sequence[dict], fused_blank_views: Optional[FusedBlankViews]
                  ) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """The BEV memory ``[bs, C, H, W]`` (after ``shared_conv``) and the camera map ``[bs * N, C, h, w]``, each
        None where the head has no such tokens; ``ValueError`` for inputs that do not fit the head."""
        name, plan = self.pass_plan.head_name, self.pass_plan
        given = [feats is not None and len(feats) > 0 and feats[0] is not None for feats in (pts_feats, img_feats)]
        for has, uses, what, key in ((given[0], plan.uses_lidar, 'LiDAR BEV', 'pts_feats'),
                                     (given[1], plan.uses_camera, 'camera', 'img_feats')):
            if uses and not has:
                raise ValueError(f'{name} needs {what} features ({key}[0])')
            if has and not uses:
                raise ValueError(f'{name} uses no {what} features, but {key} were given; use a fusion CmtHead')
        bev_feat = self.shared_conv(pts_feats[0]) if plan.uses_lidar else None
        if bev_feat is not None:
            self._check_bev_size(*bev_feat.shape[-2:])
        batch_size = bev_feat.size(0) if bev_feat is not None else len(img_metas)
        if len(img_metas) != batch_size:
            raise ValueError(f'{len(img_metas)} img_metas for a batch of {batch_size}')
        if fused_blank_views is not None and not self.training:
            raise ValueError(f'{name}: fused_blank_views is a training input (fused_image_drop_prob)')
        return bev_feat, img_feats[0] if plan.uses_camera else None

    def _check_bev_size(self, height: int, width: int) -> None:
        grid_size = (self.train_cfg or self.test_cfg or {}).get('grid_size')
        if grid_size is None:
            return
        expected = (grid_size[1] // self.downsample_scale, grid_size[0] // self.downsample_scale)
        if (height, width) != expected:
            raise ValueError(f'the BEV feature map is {height}x{width} but grid_size {list(grid_size)} / '
                             f'downsample_scale {self.downsample_scale} gives {expected[0]}x{expected[1]}; '
                             f'make the voxel grid, sparse_shape and grid_size of the config agree')

    def _queries(self, batch_size: int, gt_bboxes_3d: Optional[Sequence], gt_labels_3d: Optional[Sequence[Tensor]]
                 ) -> Tuple[Tensor, Optional[Tensor], Optional[DenoisingQueries]]:
        """Reference points ``[bs, P, 3]`` (DN queries first in training), the DN self-attention mask ``[P, P]``
        and the DN queries."""
        anchors = self.reference_points.weight.unsqueeze(0).expand(batch_size, -1, -1)
        if not (self.training and self.denoising.scalar > 0):
            return anchors, None, None
        if gt_bboxes_3d is None or gt_labels_3d is None:
            raise ValueError(f'{type(self).__name__} trains with denoising queries: pass gt_bboxes_3d and '
                             f'gt_labels_3d to forward (or set scalar=0)')
        boxes, labels = self.detection_loss.gt_boxes_and_labels(gt_bboxes_3d, gt_labels_3d, anchors.device,
                                                                check_classes=False)
        dn_queries = self.denoising.queries(boxes, labels, self.num_query, self.pc_range, sum(self.num_classes))
        if dn_queries is None:
            return anchors, None, None
        return (torch.cat((dn_queries.reference_points.to(anchors.dtype), anchors), dim=1), dn_queries.self_attn_mask,
                dn_queries)

    def _decode_pass(self, modality_pass: ModalityPass, memory: DecoderMemory, reference_points: Tensor,
                     query_embed: Tensor, self_attn_mask: Optional[Tensor], num_dn: int,
                     camera_prior: Optional[Callable[[], AttentionBias]]) -> TaskPredictions:
        """Decode the queries against the pass's keys (:meth:`PassPlan.memory_of`) with the pass's decoder."""
        memory = self.pass_plan.memory_of(modality_pass, memory, camera_prior)
        transformer, task_heads = self.pass_plan.decoder_of(modality_pass, (self.transformer, self.task_heads))
        outs_dec, _ = transformer(memory.bev_feat, memory.img_feat, query_embed, memory.bev_pos, memory.rv_pos,
                                  self_attn_mask=self_attn_mask, cross_attn_bias=memory.cross_attn_bias)
        return self._task_predictions(torch.nan_to_num(outs_dec), reference_points, num_dn, task_heads)

    def _task_predictions(self, outs_dec: Tensor, reference_points: Tensor, num_dn: int,
                          task_heads: ModuleList) -> TaskPredictions:
        """Per task ``[{name: [L, bs, Q, .]}]``, ``center`` / ``height`` in metres; DN queries' prefixed ``dn_``."""
        reference = inverse_sigmoid(reference_points)
        low = device_constant(self.pc_range[:3], reference_points.device, reference_points.dtype)
        extent = device_constant(self.pc_range[3:6], reference_points.device, reference_points.dtype) - low
        preds_dicts = []
        for task_head in task_heads:
            outs = task_head(outs_dec)
            outs['center'] = (outs['center'] + reference[..., :2]).sigmoid() * extent[:2] + low[:2]
            outs['height'] = (outs['height'] + reference[..., 2:3]).sigmoid() * extent[2:] + low[2:]
            for key in list(outs) if num_dn else ():
                outs['dn_' + key] = outs[key][:, :, :num_dn]
                outs[key] = outs[key][:, :, num_dn:]
            preds_dicts.append([outs])
        return tuple(preds_dicts)

    # ------------------------------------------------------------------ losses and boxes
    def loss(self, gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor], outputs: HeadOutputs,
             gt_num_points: Optional[Sequence[Tensor]] = None) -> Dict[str, Tensor]:
        """Detection losses of every pass (:class:`DetectionLoss`), AQR's routing losses and the aids'.

        Args:
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample, with velocity.
            gt_labels_3d (Sequence[Tensor]): per sample global class indices.
            outputs (HeadOutputs): :meth:`forward`'s in training mode.
            gt_num_points (Sequence[Tensor], optional): per sample ``[n]`` the
                LiDAR points inside each ground-truth box, needed by AQR's
                per-query routing loss (``needs_gt_point_counts``; the detector counts them).
        """
        matched_objects = [] if outputs.routing is not None and self.needs_gt_point_counts else None
        losses = self._detection_losses(gt_bboxes_3d, gt_labels_3d, outputs, matched_objects)
        losses.update(self.router.loss(outputs.routing, matched_objects, gt_bboxes_3d, gt_num_points,
                                       type(self).__name__))
        losses.update(self.camera_aids.loss(outputs.image_aux, outputs.fused_black_samples, gt_bboxes_3d,
                                            gt_labels_3d, outputs[0][0]['cls_logits'].device))
        if outputs.bev_aux is not None:
            losses.update({BEV_AUX_PREFIX + name: value
                           for name, value in self.bev_aux_head.loss(outputs.bev_aux, gt_bboxes_3d,
                                                                     gt_labels_3d).items()})
        return losses

    @force_fp32(apply_to=())  # autocast off with fp16_enabled, as for CMT's loss; the outputs cast themselves
    def _detection_losses(self, gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor], outputs: HeadOutputs,
                          matched_objects: Optional[list]) -> Dict[str, Tensor]:
        return self.detection_loss(gt_bboxes_3d, gt_labels_3d, outputs.float(), matched_objects)

    @force_fp32(apply_to=())  # autocast off with fp16_enabled; the predictions are cast to fp32 below
    def get_bboxes(self, preds_dicts: Sequence[List[dict]], img_metas: Sequence[dict], img: Optional[Tensor] = None,
                   rescale: bool = False) -> List[list]:
        """Decode the last decoder layer into boxes (NMS-free).

        Args:
            preds_dicts (HeadOutputs | Sequence[list[dict]]): :meth:`forward`'s
                outputs, or per task ``[dict]`` in their layout.
            img_metas (Sequence[dict]): ``box_type_3d`` per sample (default ``LiDARInstance3DBoxes``).
            img, rescale: unused (mmdet3d's interface).

        Returns:
            list[list]: per sample ``[boxes (box_type_3d, bottom centre, 9-dim), scores [N], labels [N]]``; with
            ``BevAuxHead(heading_at_inference=True)`` (``velocity_at_inference``) the boxes of samples with points
            take the yaw (velocity) of its maps at their centre.
        """
        results = []
        decoded_samples = self.bbox_coder.decode(fp32_predictions(preds_dicts))
        bev_aux = getattr(preds_dicts, 'bev_aux', None)
        if bev_aux is not None:
            fields = self.bev_aux_head.regression_at(bev_aux,
                                                     [decoded['bboxes'][:, :2] for decoded in decoded_samples])
        for index, (meta, decoded) in enumerate(zip(img_metas, decoded_samples)):
            bboxes = decoded['bboxes'].clone()
            if bev_aux is not None and bev_aux.trained[index]:
                if self.bev_aux_head.heading_at_inference:
                    bboxes[:, 6] = fields[index][:, 0]
                if self.bev_aux_head.velocity_at_inference:
                    bboxes[:, 7:9] = fields[index][:, 1:]
            bboxes[:, 2] = bboxes[:, 2] - bboxes[:, 5] * 0.5
            box_type = meta.get('box_type_3d', LiDARInstance3DBoxes)
            results.append([box_type(bboxes, box_dim=bboxes.size(-1)), decoded['scores'], decoded['labels']])
        return results


register_legacy_types(HEADS, ('CmtLidarHead', 'CmtImageHead'))
