"""CMT's detection head: position encodings, queries, the transformer and the task branches.

``CmtHead`` (fusion) decodes 900 learned anchor queries against the memory
``[BEV tokens ; camera tokens]``; ``CmtLidarHead`` uses BEV tokens only and
``CmtImageHead`` camera tokens only. Parameter names equal upstream CMT's, so
published checkpoints load with no missing or unexpected keys. In training,
``CmtHead`` can also decode the same queries against each modality's tokens
alone (``modality_passes``, see :mod:`.modality_passes`).

Camera learning aids (default off): ``image_aux_config`` adds an
:class:`ImageAuxHead` (2D centre heatmaps and object depth on the camera
feature map, training losses ``image_aux.*``); ``camera_depth_position``
adds to each camera token's position the ``bev_embedding`` of its pixel
centre lifted to the aux head's (detached) predicted depth (3DPPE-style), so
a query whose reference point is near that 3D point matches the token.
``camera_window_prior`` (:class:`CameraWindowPrior`) gives every query of a
pass that decodes camera tokens only (``CmtImageHead``'s one pass, ``CmtHead``'s
``'camera'`` pass) a fixed cross-attention bias around its projected camera
cell, CMT-AQR's local camera bias without a router.

Position encodings (sizes always read from the feature maps):

* BEV token ``(h, w)``: ``bev_embedding(pos2embed(cell centre))``.
* camera token ``(view, h, w)``: the frustum of the feature cell (``depth_num``
  depths), lifted to LiDAR coordinates with ``inverse(lidar2img)``, normalised
  by ``pc_range`` and embedded by ``rv_embedding`` (``3 * depth_num`` inputs).
* query with reference point ``r`` (normalised 3D): ``bev_embedding(pos2embed(r))``
  plus, with a camera, the sum over the views that see ``r`` of the
  ``rv_embedding`` of the frustum through ``r``'s projection.
* with ``camera_depth_position``, a camera token's embedding adds
  ``bev_embedding(pos2embed(p))``, ``p`` its pixel centre lifted to LiDAR
  coordinates at the predicted depth, normalised by ``pc_range`` and clamped
  to ``[0, 1]``.

Outputs follow upstream CMT's regression layout: per query the branches
``center (2), height (1), dim (3), rot (2), vel (2)`` are concatenated into one
10-value code that is compared with :func:`normalize_bbox`'s
``(cx, cy, log w, log l, cz, log h, sin, cos, vx, vy)``. ``center`` and
``height`` are decoded to metres (sigmoid around the reference point); so the
third slot, named ``height`` upstream, is the one trained against ``log w``
(and ``dim``'s second value against ``cz``). Published checkpoints were trained
with this layout, and :class:`MultiTaskBBoxCoder` decodes it the same way.
"""
import copy
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmcv.cnn import ConvModule
from mmcv.runner import BaseModule, ModuleDict, ModuleList, force_fp32
from mmdet.core import build_assigner, build_bbox_coder
from mmdet.models.builder import HEADS, build_head, build_loss
from mmdet.models.utils import build_transformer
from mmdet.models.utils.transformer import inverse_sigmoid
from mmdet3d.core.bbox import LiDARInstance3DBoxes
from torch import Tensor, nn

from ...attention import AttentionBias
from ...core.host_data import device_constant
from ..aqr.design_note_keys import HEAD_RENAMED_KEYS, reject_renamed_keys
from ..utils.camera_geometry import invert_lidar2img, lift_pixels, pad_shape_hw, project_to_views, stack_lidar2img
from ..utils.denoising import DenoisingQueries, build_dn_queries
from ..utils.image_targets import lift_cell_centres
from ..utils.positional_encoding import (bev_grid_coords, denormalize_points, depth_bins, image_frustum_points,
                                         normalize_points, pos2embed)
from .aqr_routing import AQRRoutingMixin, RoutedInputs, routing_of
from .camera_window_prior import CameraWindowPrior
from .cmt_head_loss import CmtHeadLossMixin
from .image_aux_head import IMAGE_AUX_KEY, IMAGE_AUX_PREFIX, ImageAuxOutputs
from .key_range_bias import restrict_to_keys
from .modality_passes import (FUSED, FUSED_BLACK_SAMPLES_KEY, MODALITY_PASSES, PASS_PREDICTIONS_KEY,
                              TRAINED_SAMPLES_KEY, FusedBlankViews, ModalityPass, build_modality_passes,
                              camera_free_samples, check_pass_options, lidar_free_samples, merge_sample_predictions,
                              replace_sample_views, trained_samples, with_dropped_images)

NUSCENES_TASKS = (
    dict(num_class=1, class_names=['car']),
    dict(num_class=2, class_names=['truck', 'construction_vehicle']),
    dict(num_class=2, class_names=['bus', 'trailer']),
    dict(num_class=1, class_names=['barrier']),
    dict(num_class=2, class_names=['motorcycle', 'bicycle']),
    dict(num_class=2, class_names=['pedestrian', 'traffic_cone']),
)
REGRESSION_HEADS = dict(center=(2, 2), height=(1, 2), dim=(3, 2), rot=(2, 2), vel=(2, 2))


@HEADS.register_module()
class CmtHead(AQRRoutingMixin, CmtHeadLossMixin, BaseModule):
    """Fusion head: queries attend to BEV and camera tokens, optionally routed by AQR.

    Args:
        in_channels (int): channels of the BEV feature map (before ``shared_conv``).
        num_query (int): learned anchor queries Q.
        hidden_dim (int): transformer width C.
        depth_num (int): depths of each camera frustum (``rv_embedding`` takes
            ``3 * depth_num`` inputs).
        norm_bbox (bool): must be True (CMT regresses :func:`normalize_bbox`
            codes); kept for upstream configs.
        downsample_scale (int): BEV feature stride in voxels. When the
            train/test config has ``grid_size``, the BEV map must be
            ``grid_size[:2] // downsample_scale``, else a ``ValueError`` names
            the mismatch.
        scalar (int): maximum number of DN groups (0 disables DN training).
        noise_scale (float): DN centre noise scale.
        noise_trans (float): DN noise offset in metres.
        dn_weight (float): weight of the DN losses.
        split (float): DN noise norm beyond which a copy is background.
        train_cfg (dict, optional): ``assigner`` and ``code_weights`` (10 values).
        test_cfg (dict, optional): test config (only ``grid_size`` is read).
        common_heads (dict): regression branches ``name -> (channels, num_conv)``.
        tasks (Sequence[dict]): ``dict(num_class, class_names)`` per task head;
            the tasks' classes, in order, are the global classes.
        transformer (dict): ``CmtTransformer`` config (its decoder's
            ``num_layers`` sets the task heads' groups).
        bbox_coder (dict): ``MultiTaskBBoxCoder`` config; its ``pc_range`` is the head's.
        loss_cls (dict): classification loss (sigmoid focal loss).
        loss_bbox (dict): regression loss (L1).
        loss_heatmap (dict, optional): accepted for upstream configs, which
            declare it although CMT computes no heatmap loss; a warning says so.
        separate_head (dict): ``SeparateTaskHead`` config.
        aqr_config (dict, optional): ``AQRWeightGenerator`` config; turns on
            Adaptive Query Routing (fusion head only, see :mod:`.aqr_routing`).
            None (default): plain CMT, same outputs and state dict.
        attention_bias_config (dict, optional): ``AttentionBiasGenerator``
            config, with ``modulation='attention_bias'``.
        modulation (str): ``'attention_bias'`` (bias on the cross-attention
            scores) or ``'feature'`` (legacy: weight maps scale the features).
        weight_renderer_config (dict, optional): ``WeightRenderer`` config
            (``modulation='feature'``).
        feature_modulator_config (dict, optional): ``FeatureModulator`` config
            (``modulation='feature'``).
        enable_aqr (bool, optional): the design notes' switch: None (default)
            runs AQR iff ``aqr_config`` is given; True requires it; False
            gives plain CMT even when the AQR configs are present.
        renderer_config (dict, optional): the design notes' name of
            ``weight_renderer_config``; raises a ``ValueError`` naming it.
        modulator_config (dict, optional): the design notes' name of
            ``feature_modulator_config``; raises a ``ValueError`` naming it.
        aqr_bias_strength (float, optional): the design notes' form of
            ``attention_bias_config``'s ``bias_scale``; raises a ``ValueError``
            naming it.
        aqr_use_local_bias (bool, optional): the design notes' form of
            ``attention_bias_config``'s ``use_local_bias``; raises likewise.
        modality_passes (Sequence[str]): decoding passes of a training step,
            ``'fused'`` and optionally ``'lidar'`` / ``'camera'`` (the BEV or
            the camera tokens only; fusion head only), each with its own
            matching, DN and losses (see :mod:`.modality_passes`). Inference
            decodes the fused pass. Default ``('fused',)``: plain CMT.
        pass_decoders (str): ``'shared'`` (default): every pass decodes
            with the head's transformer and task heads; ``'separate'``: each
            single-modality pass has its own (``separate_decoders.<pass>``).
        lidar_free_pass (str, optional): a trained single-modality pass
            without BEV keys (``'camera'``) that decodes, at inference, the
            samples whose point cloud is empty; the others keep the fused
            pass. None (default): the fused pass decodes every sample.
        camera_free_pass (str, optional): a trained single-modality pass
            without camera keys (``'lidar'``) that decodes, at inference, the
            samples whose camera images are all blank (every pixel of each
            view equal, a black frame); a sample without LiDAR points too keeps
            the fused pass. None (default): no such fallback.
        image_aux_config (dict, optional): ``ImageAuxHead`` config (its
            ``in_channels`` and ``num_classes`` are set from ``hidden_dim`` and
            the tasks); adds the ``image_aux.loss_heatmap`` /
            ``image_aux.loss_depth`` training losses. Heads with a camera only.
            None (default): no aux head, same state dict and outputs.
        camera_depth_position (bool): add to the camera tokens' position
            embedding the ``bev_embedding`` of their pixel centre lifted to the
            aux head's detached predicted depth (needs ``image_aux_config``
            with a depth branch; the aux head then also runs at test time).
            Default False.
        camera_window_prior (dict, optional): :class:`CameraWindowPrior`
            config, e.g. ``dict(window_size=5, bias=4.0)``: every query (DN
            queries included) of a pass that decodes camera tokens only gets
            a fixed cross-attention bias, ``bias`` at its reference point's
            camera cell decaying to 0 at ``window_size / 2`` cells, instead of
            the routed bias (a single modality leaves nothing to route). No
            parameters. None (default): the routed bias, if any.
        fused_image_drop_prob (float): in training, the probability that a
            sample's fused pass (and its routing) sees black camera views while
            the single-modality passes and the camera aids see its real images:
            the fused pass learns to detect when the cameras fail
            (``camera_drop``) without taking the sample from the camera pass, as
            ``ModalMask3D``'s ``image_drop_prob`` does. The detector computes
            the black views' features in the same image-backbone batch
            (:meth:`draw_fused_image_drops`, ``CmtDetector``). Fusion heads
            with ``modulation='attention_bias'``; default 0: no draw, no change.
        init_cfg (dict, optional): must be None.
    """

    uses_lidar = True
    uses_camera = True

    def __init__(self,
                 in_channels: int,
                 num_query: int = 900,
                 hidden_dim: int = 128,
                 depth_num: int = 64,
                 norm_bbox: bool = True,
                 downsample_scale: int = 8,
                 scalar: int = 10,
                 noise_scale: float = 1.0,
                 noise_trans: float = 0.0,
                 dn_weight: float = 1.0,
                 split: float = 0.75,
                 train_cfg: Optional[dict] = None,
                 test_cfg: Optional[dict] = None,
                 common_heads: dict = REGRESSION_HEADS,
                 tasks: Sequence[dict] = NUSCENES_TASKS,
                 transformer: Optional[dict] = None,
                 bbox_coder: Optional[dict] = None,
                 loss_cls: dict = dict(type='FocalLoss', use_sigmoid=True, reduction='mean', gamma=2, alpha=0.25,
                                       loss_weight=1.0),
                 loss_bbox: dict = dict(type='L1Loss', reduction='mean', loss_weight=0.25),
                 loss_heatmap: Optional[dict] = None,
                 separate_head: dict = dict(type='SeparateTaskHead', init_bias=-2.19, final_kernel=1),
                 aqr_config: Optional[dict] = None,
                 attention_bias_config: Optional[dict] = None,
                 modulation: str = 'attention_bias',
                 weight_renderer_config: Optional[dict] = None,
                 feature_modulator_config: Optional[dict] = None,
                 enable_aqr: Optional[bool] = None,
                 renderer_config: Optional[dict] = None,
                 modulator_config: Optional[dict] = None,
                 aqr_bias_strength: Optional[float] = None,
                 aqr_use_local_bias: Optional[bool] = None,
                 modality_passes: Sequence[str] = ('fused', ),
                 pass_decoders: str = 'shared',
                 lidar_free_pass: Optional[str] = None,
                 camera_free_pass: Optional[str] = None,
                 image_aux_config: Optional[dict] = None,
                 camera_depth_position: bool = False,
                 camera_window_prior: Optional[dict] = None,
                 fused_image_drop_prob: float = 0.0,
                 init_cfg: Optional[dict] = None) -> None:
        reject_renamed_keys(type(self).__name__, HEAD_RENAMED_KEYS, renderer_config=renderer_config,
                            modulator_config=modulator_config, aqr_bias_strength=aqr_bias_strength,
                            aqr_use_local_bias=aqr_use_local_bias)
        if init_cfg is not None:
            raise ValueError(f'{type(self).__name__} initialises itself; init_cfg must be None, got {init_cfg}')
        if not norm_bbox:
            raise ValueError('CMT regresses normalize_bbox codes; norm_bbox=False is not supported')
        if transformer is None or bbox_coder is None:
            raise ValueError(f'{type(self).__name__} needs a transformer and a bbox_coder config')
        if loss_heatmap is not None:
            warnings.warn(f'{type(self).__name__}: loss_heatmap is accepted for upstream CMT configs but CMT '
                          f'computes no heatmap loss; it is not used')
        super().__init__(init_cfg=None)
        self.num_classes = [len(task['class_names']) for task in tasks]
        for task in tasks:
            if task.get('num_class', len(task['class_names'])) != len(task['class_names']):
                raise ValueError(f'task {task}: num_class differs from the number of class_names')
        self.class_names = [list(task['class_names']) for task in tasks]
        self.hidden_dim = hidden_dim
        self.num_query = num_query
        self.in_channels = in_channels
        self.depth_num = depth_num
        self.downsample_scale = downsample_scale
        self.scalar = scalar
        self.bbox_noise_scale = noise_scale
        self.bbox_noise_trans = noise_trans
        self.dn_weight = dn_weight
        self.split = split
        self.train_cfg = train_cfg
        self.test_cfg = test_cfg
        self.fp16_enabled = False
        self.modality_passes = build_modality_passes(modality_passes, type(self).__name__, self.uses_lidar,
                                                     self.uses_camera)
        self.lidar_free_pass, self.camera_free_pass = check_pass_options(
            self.modality_passes, pass_decoders, lidar_free_pass, camera_free_pass, type(self).__name__)

        self.loss_cls = build_loss(loss_cls)
        self.loss_bbox = build_loss(loss_bbox)
        self.bbox_coder = build_bbox_coder(bbox_coder)
        self.pc_range = list(self.bbox_coder.pc_range)
        if self.bbox_coder.num_classes != sum(self.num_classes):
            raise ValueError(f'bbox_coder.num_classes={self.bbox_coder.num_classes} but the tasks have '
                             f'{sum(self.num_classes)} classes')

        if self.uses_lidar:
            self.shared_conv = ConvModule(in_channels, hidden_dim, kernel_size=3, padding=1,
                                          conv_cfg=dict(type='Conv2d'), norm_cfg=dict(type='BN2d'))
        self.transformer = build_transformer(transformer)
        if self.transformer.embed_dims != hidden_dim:
            raise ValueError(f'transformer width {self.transformer.embed_dims} differs from hidden_dim {hidden_dim}')
        self.reference_points = nn.Embedding(num_query, 3)
        self.bev_embedding = nn.Sequential(
            nn.Linear(hidden_dim * 2, hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, hidden_dim))
        if self.uses_camera:
            self.rv_embedding = nn.Sequential(
                nn.Linear(depth_num * 3, hidden_dim * 4), nn.ReLU(inplace=True), nn.Linear(hidden_dim * 4, hidden_dim))
        self.task_heads = self._build_task_heads(common_heads, separate_head)
        # mmcv's ModuleDict / ModuleList, so that init_weights() reaches every transformer and SeparateTaskHead
        # (with torch's containers the classification prior init_bias would never be set).
        self.separate_decoders = ModuleDict()
        if pass_decoders == 'separate':
            for modality_pass in self.modality_passes[1:]:
                self.separate_decoders[modality_pass.name] = ModuleDict(dict(
                    transformer=build_transformer(transformer),
                    task_heads=self._build_task_heads(common_heads, separate_head)))
        if train_cfg:
            self.assigner = build_assigner(train_cfg['assigner'])
        self.init_query_routing(aqr_config, attention_bias_config, modulation, weight_renderer_config,
                                feature_modulator_config, enable_aqr)
        self._init_camera_aids(image_aux_config, camera_depth_position)
        self.camera_window_prior = None
        if camera_window_prior is not None:
            if not any(self._decodes_camera_only(modality_pass) for modality_pass in self.modality_passes):
                names = tuple(modality_pass.name for modality_pass in self.modality_passes)
                raise ValueError(f"{type(self).__name__}: camera_window_prior biases the passes that decode camera "
                                 f"tokens only, but none of modality_passes {names} does; add 'camera'")
            self.camera_window_prior = CameraWindowPrior(**camera_window_prior)
        self._init_fused_image_drop(fused_image_drop_prob)

    def _decodes_camera_only(self, modality_pass: ModalityPass) -> bool:
        """Whether ``modality_pass`` of this head decodes camera tokens and no BEV tokens."""
        return (self.uses_camera and modality_pass.uses_camera
                and not (self.uses_lidar and modality_pass.uses_lidar))

    def _build_task_heads(self, common_heads: dict, separate_head: dict) -> ModuleList:
        """One ``SeparateTaskHead`` per task, its groups one per decoder layer."""
        num_layers = len(self.transformer.decoder.layers)
        task_heads = ModuleList()
        for num_cls in self.num_classes:
            heads = dict(copy.deepcopy(common_heads), cls_logits=(num_cls, 2))
            task_heads.append(build_head(dict(separate_head, in_channels=self.hidden_dim, heads=heads,
                                              groups=num_layers)))
        return task_heads

    @property
    def needs_points_in_metas(self) -> bool:
        """Whether the detector must put each sample's points in its img_meta at test time (oracle routing, or
        ``lidar_free_pass`` telling the samples without LiDAR)."""
        return super().needs_points_in_metas or self.lidar_free_pass is not None

    @property
    def needs_blank_views_in_metas(self) -> bool:
        """Whether the detector must put, at test time, which camera images are blank in each img_meta
        (``camera_free_pass`` telling the samples without cameras)."""
        return self.camera_free_pass is not None

    def _init_camera_aids(self, image_aux_config: Optional[dict], camera_depth_position: bool) -> None:
        """Build the optional :class:`ImageAuxHead` and check ``camera_depth_position`` against it."""
        self.image_aux_head = None
        if image_aux_config is not None:
            if not self.uses_camera:
                raise ValueError(f'{type(self).__name__} has no camera features: image_aux_config needs a head '
                                 f'with a camera (CmtHead or CmtImageHead)')
            self.image_aux_head = build_head(dict(image_aux_config, in_channels=self.hidden_dim,
                                                  num_classes=sum(self.num_classes)))
        if camera_depth_position and not (self.image_aux_head is not None and self.image_aux_head.with_depth):
            raise ValueError(f'{type(self).__name__}: camera_depth_position=True lifts camera tokens at the depth '
                             f'ImageAuxHead predicts; give image_aux_config=dict(type=\'ImageAuxHead\', ...) '
                             f'with a depth branch (loss_depth not None)')
        self.camera_depth_position = camera_depth_position

    def _init_fused_image_drop(self, probability: float) -> None:
        """Check and keep ``fused_image_drop_prob``."""
        if not 0.0 <= probability < 1.0:
            raise ValueError(f'{type(self).__name__}: fused_image_drop_prob must be in [0, 1), got {probability}')
        if probability > 0 and not (self.uses_lidar and self.uses_camera):
            raise ValueError(f'{type(self).__name__}: fused_image_drop_prob blacks out the cameras of the fused pass '
                             f'of a fusion head; this head decodes one modality (use ModalMask3D for input drops)')
        if probability > 0 and self.with_query_routing and self.modulation != 'attention_bias':
            raise ValueError(f"{type(self).__name__}: fused_image_drop_prob needs modulation='attention_bias' (the "
                             f"feature modulation would modulate the camera passes' features by the fused routing)")
        self.fused_image_drop_prob = probability

    def draw_fused_image_drops(self, img_metas: Sequence[dict]) -> Tuple[bool, ...]:
        """Per training sample, whether its fused pass sees black camera views (``fused_image_drop_prob``).

        Samples whose images ``ModalMask3D`` already dropped are not drawn. Draws
        from torch's global generator only when ``fused_image_drop_prob > 0``.
        """
        if self.fused_image_drop_prob == 0:
            return (False, ) * len(img_metas)
        draws = (torch.rand(len(img_metas)) < self.fused_image_drop_prob).tolist()
        have_images = trained_samples(MODALITY_PASSES['camera'], img_metas)
        return tuple(draw and images for draw, images in zip(draws, have_images))

    def init_weights(self) -> None:
        """Children's initialisation, then anchor reference points uniform in ``[0, 1]^3``."""
        super().init_weights()
        nn.init.uniform_(self.reference_points.weight, 0, 1)

    # ------------------------------------------------------------------ position encodings
    def _check_bev_size(self, height: int, width: int) -> None:
        cfg = self.train_cfg or self.test_cfg or {}
        grid_size = cfg.get('grid_size')
        if grid_size is None:
            return
        expected = (grid_size[1] // self.downsample_scale, grid_size[0] // self.downsample_scale)
        if (height, width) != expected:
            raise ValueError(f'the BEV feature map is {height}x{width} but grid_size {list(grid_size)} / '
                             f'downsample_scale {self.downsample_scale} gives {expected[0]}x{expected[1]}; '
                             f'make the voxel grid, sparse_shape and grid_size of the config agree')

    def bev_pos_embed(self, height: int, width: int, device: torch.device) -> Tensor:
        """Embedding of the BEV cell centres, ``[height * width, C]`` (row-major)."""
        return self.bev_embedding(pos2embed(bev_grid_coords(height, width, device), self.hidden_dim))

    def rv_pos_embed(self, img_feat: Tensor, img_metas: Sequence[dict],
                     token_depth: Optional[Tensor] = None) -> Tensor:
        """Embedding of the camera feature cells' frustums (and, with ``token_depth``, of their lifted points).

        Args:
            img_feat (Tensor): ``[bs * N, C, h, w]``.
            img_metas (Sequence[dict]): ``lidar2img`` (N matrices) and ``pad_shape``.
            token_depth (Tensor, optional): ``[bs * N, h, w]`` depth in metres
                of each cell; adds :meth:`token_depth_pos_embed`.

        Returns:
            Tensor: ``[bs * N, h, w, C]``.
        """
        return self._with_token_depth(self.frustum_pos_embed(img_feat, img_metas), token_depth, img_metas)

    def frustum_pos_embed(self, img_feat: Tensor, img_metas: Sequence[dict]) -> Tensor:
        """``rv_embedding`` of the camera feature cells' frustums (``depth_num`` points each), ``[bs * N, h, w, C]``.

        Depends on the features' shape and the metas only, not on their values.
        """
        lidar2img = stack_lidar2img(img_metas, img_feat.device)
        bs, num_views = lidar2img.shape[:2]
        if bs * num_views != img_feat.size(0):
            raise ValueError(f'img_metas describe {bs} samples x {num_views} views but the camera features have '
                             f'{img_feat.size(0)} maps')
        img2lidar = invert_lidar2img(lidar2img).flatten(0, 1)
        depths = depth_bins(self.depth_num, self.pc_range[3], img_feat.device)
        frustum = image_frustum_points(img_feat.shape[-2:], pad_shape_hw(img_metas), depths)
        points = torch.einsum('hwdo,nco->nhwdc', frustum, img2lidar)[..., :3]
        return self.rv_embedding(normalize_points(points, self.pc_range).flatten(-2))

    def token_depth_pos_embed(self, token_depth: Tensor, img_metas: Sequence[dict]) -> Tensor:
        """``bev_embedding`` of the camera cells' pixel centres lifted to ``token_depth``.

        Args:
            token_depth (Tensor): ``[bs * N, h, w]`` metres.
            img_metas (Sequence[dict]): ``lidar2img`` (N matrices) and ``pad_shape``.

        Returns:
            Tensor: ``[bs * N, h, w, C]``.
        """
        img2lidar = invert_lidar2img(stack_lidar2img(img_metas, token_depth.device)).flatten(0, 1)
        points = lift_cell_centres(token_depth, img2lidar, pad_shape_hw(img_metas))
        return self.bev_embedding(pos2embed(normalize_points(points, self.pc_range).clamp(0, 1), self.hidden_dim))

    def _with_token_depth(self, frustum_pos: Tensor, token_depth: Optional[Tensor],
                          img_metas: Sequence[dict]) -> Tensor:
        """``frustum_pos`` ``[bs * N, h, w, C]`` plus, with ``token_depth``, :meth:`token_depth_pos_embed`."""
        if token_depth is None:
            return frustum_pos
        return frustum_pos + self.token_depth_pos_embed(token_depth, img_metas)

    def query_pos_embed(self, reference_points: Tensor, img_metas: Sequence[dict]) -> Tensor:
        """Positional embedding of the queries.

        Args:
            reference_points (Tensor): ``[bs, P, 3]`` normalised reference points.
            img_metas (Sequence[dict]): needs ``lidar2img`` and ``pad_shape``
                when the head uses the camera.

        Returns:
            Tensor: ``[bs, P, C]``.
        """
        reference_points = inverse_sigmoid(reference_points).sigmoid()
        embed = self.bev_embedding(pos2embed(reference_points, self.hidden_dim))
        if self.uses_camera:
            embed = embed + self._camera_query_embed(reference_points, img_metas)
        return embed

    def _camera_query_embed(self, reference_points: Tensor, img_metas: Sequence[dict]) -> Tensor:
        """Sum over the views that see each reference point of its frustum embedding, ``[bs, P, C]``."""
        lidar2img = stack_lidar2img(img_metas, reference_points.device)
        if lidar2img.size(0) != reference_points.size(0):
            raise ValueError(f'{lidar2img.size(0)} img_metas for a batch of {reference_points.size(0)}')
        points = denormalize_points(reference_points, self.pc_range)
        image_points, visible = project_to_views(points, lidar2img, pad_shape_hw(img_metas))
        depths = depth_bins(self.depth_num, self.pc_range[3], points.device)
        frustums = lift_pixels(image_points, depths, invert_lidar2img(lidar2img))
        embeds = self.rv_embedding(normalize_points(frustums, self.pc_range).flatten(-2))
        return (embeds * visible.unsqueeze(-1)).sum(dim=1)

    # ------------------------------------------------------------------ forward
    def forward(self,
                pts_feats: Sequence[Optional[Tensor]],
                img_feats: Sequence[Optional[Tensor]],
                img_metas: Sequence[dict],
                gt_bboxes_3d: Optional[Sequence[LiDARInstance3DBoxes]] = None,
                gt_labels_3d: Optional[Sequence[Tensor]] = None,
                fused_blank_views: Optional[FusedBlankViews] = None) -> Tuple[List[dict], ...]:
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
            tuple[list[dict]]: per task a one-element list (one feature level)
            with ``center [L, bs, Q, 2]`` and ``height [L, bs, Q, 1]`` in metres,
            ``dim [L, bs, Q, 3]``, ``rot [L, bs, Q, 2]``, ``vel [L, bs, Q, 2]``,
            ``cls_logits [L, bs, Q, C_t]``; in training also ``dn_queries``
            (``DenoisingQueries`` or None) and, with DN queries, the same six
            outputs for them prefixed ``dn_`` (``[L, bs, pad_size, .]``).
            These are the fused pass's. With AQR the first task's dict also
            holds ``aqr_routing`` (:class:`QueryRouting`: the weights and
            projections of the queries); in training with more passes it
            holds ``modality_passes``: ``{pass name: that pass's outputs}``
            in this layout, whose first task's dict adds ``trained_samples``
            (per sample, whether the pass's input was there); with an
            ``ImageAuxHead``, in training it holds ``image_aux``
            (:class:`ImageAuxOutputs`); with ``fused_blank_views``,
            ``fused_black_samples`` (its ``samples``). At inference with ``lidar_free_pass``
            (``camera_free_pass``), the samples without LiDAR points (with
            blank cameras) hold that pass's predictions.
        """
        bev_feat = self._bev_input(pts_feats)
        img_feat = self._camera_input(img_feats)
        batch_size = bev_feat.size(0) if bev_feat is not None else len(img_metas)
        if len(img_metas) != batch_size:
            raise ValueError(f'{len(img_metas)} img_metas for a batch of {batch_size}')
        if fused_blank_views is not None and not self.training:
            raise ValueError(f'{type(self).__name__}: fused_blank_views is a training input (fused_image_drop_prob)')

        dn_queries = None
        if self.training and self.scalar > 0:
            if gt_bboxes_3d is None or gt_labels_3d is None:
                raise ValueError(f'{type(self).__name__} trains with denoising queries: pass gt_bboxes_3d and '
                                 f'gt_labels_3d to forward (or set scalar=0)')
            boxes, labels = self.gt_boxes_and_labels(gt_bboxes_3d, gt_labels_3d)
            dn_queries = build_dn_queries(boxes, labels, self.num_query, self.scalar, self.bbox_noise_scale,
                                          self.bbox_noise_trans, self.split, self.pc_range, sum(self.num_classes))
        anchors = self.reference_points.weight.unsqueeze(0).expand(batch_size, -1, -1)
        if dn_queries is not None:
            reference_points = torch.cat((dn_queries.reference_points.to(anchors.dtype), anchors), dim=1)
            self_attn_mask = dn_queries.self_attn_mask
        else:
            reference_points, self_attn_mask = anchors, None

        query_embed = self.query_pos_embed(reference_points, img_metas)
        bev_pos = self.bev_pos_embed(*bev_feat.shape[-2:], bev_feat.device) if bev_feat is not None else None
        image_aux = blank_depth = None
        if self.image_aux_head is not None and (self.training or self.camera_depth_position):
            image_aux, blank_depth = self._image_aux(img_feat, img_metas, fused_blank_views)
        token_depth = image_aux.depth.detach()[:, 0] if self.camera_depth_position else None
        frustum_pos = rv_pos = None
        if img_feat is not None:
            frustum_pos = self.frustum_pos_embed(img_feat, img_metas)
            rv_pos = self._with_token_depth(frustum_pos, token_depth, img_metas)
        fused_img_feat, fused_rv_pos, fused_metas = img_feat, rv_pos, img_metas
        if fused_blank_views is not None:
            fused_img_feat, fused_rv_pos, fused_metas = self._blank_fused_cameras(
                img_feat, frustum_pos, img_metas, fused_blank_views, token_depth, blank_depth)
        routed = self.route_queries(reference_points, query_embed, bev_feat, bev_pos, fused_img_feat, fused_rv_pos,
                                    fused_metas, dn_queries)
        single_modality_inputs = routed, rv_pos
        if fused_blank_views is not None:  # the other passes decode the real camera images
            single_modality_inputs = routed._replace(img_feat=img_feat), rv_pos
        fallbacks = () if self.training else self._fallback_passes(img_metas)
        passes = self.modality_passes if self.training else (FUSED, ) + tuple(pass_ for pass_, _ in fallbacks)
        decoded = [self._decode_pass(modality_pass,
                                     *((routed, fused_rv_pos) if modality_pass is FUSED else single_modality_inputs),
                                     bev_pos, query_embed, self_attn_mask, reference_points, dn_queries, img_metas)
                   for modality_pass in passes]
        preds_dicts = decoded[0]
        for (_, samples), pass_preds in zip(fallbacks, decoded[1:]):
            preds_dicts = merge_sample_predictions(preds_dicts, pass_preds,
                                                   torch.tensor(samples, device=reference_points.device))
        if routed.routing is not None:
            preds_dicts[0][0]['aqr_routing'] = routed.routing
        if self.training and len(passes) > 1:
            preds_dicts[0][0][PASS_PREDICTIONS_KEY] = {
                modality_pass.name: pass_preds for modality_pass, pass_preds in zip(passes[1:], decoded[1:])}
        if image_aux is not None and self.training:
            preds_dicts[0][0][IMAGE_AUX_KEY] = image_aux
        if fused_blank_views is not None:
            preds_dicts[0][0][FUSED_BLACK_SAMPLES_KEY] = fused_blank_views.samples
        return preds_dicts

    def _image_aux(self, img_feat: Tensor, img_metas: Sequence[dict], fused_blank_views: Optional[FusedBlankViews]
                   ) -> Tuple[ImageAuxOutputs, Optional[Tensor]]:
        """The aux head's outputs on ``img_feat`` and, with ``fused_blank_views``, its depth ``[k * N, 1, h, w]`` of
        the black views (one batch, as the image backbone ran them, so that BatchNorm sees what it sees there)."""
        if fused_blank_views is None:
            return self.image_aux_head(img_feat, img_metas), None
        blank_metas = [meta for meta, blank in zip(img_metas, fused_blank_views.samples) if blank]
        both = self.image_aux_head(torch.cat((img_feat, fused_blank_views.img_feat)), list(img_metas) + blank_metas)
        depth = None if both.depth is None else both.depth[img_feat.size(0):]
        return both.first_samples(len(img_metas)), depth

    def _blank_fused_cameras(self, img_feat: Tensor, frustum_pos: Tensor, img_metas: Sequence[dict],
                             fused_blank_views: FusedBlankViews, token_depth: Optional[Tensor],
                             blank_depth: Optional[Tensor]) -> Tuple[Tensor, Tensor, List[dict]]:
        """The fused pass's camera memory ``[bs * N, C, h, w]``, its position embedding ``[bs * N, h, w, C]`` and
        metas, with the ``fused_blank_views`` samples' views black (their images marked dropped for the routing).
        The views keep their frustum embedding ``frustum_pos``; with ``token_depth`` the black views' depth term is
        that of their own ``blank_depth``."""
        samples = fused_blank_views.samples
        fused_img_feat = replace_sample_views(img_feat, samples, fused_blank_views.img_feat)
        fused_depth = None
        if token_depth is not None:
            fused_depth = replace_sample_views(token_depth[:, None], samples, blank_depth.detach())[:, 0]
        return (fused_img_feat, self._with_token_depth(frustum_pos, fused_depth, img_metas),
                with_dropped_images(img_metas, samples))

    def _fallback_passes(self, img_metas: Sequence[dict]) -> Tuple[Tuple[ModalityPass, Tuple[bool, ...]], ...]:
        """The inference passes besides the fused one, each with the samples it decodes: ``lidar_free_pass`` those
        without LiDAR points, ``camera_free_pass`` those whose camera images are all blank; a sample without
        either keeps the fused pass. Only passes that take a sample are listed."""
        nothing = (False, ) * len(img_metas)
        lidar_free = nothing if self.lidar_free_pass is None else lidar_free_samples(img_metas)
        camera_free = nothing if self.camera_free_pass is None else camera_free_samples(img_metas)
        fallbacks = []
        for modality_pass, lost, other in ((self.lidar_free_pass, lidar_free, camera_free),
                                           (self.camera_free_pass, camera_free, lidar_free)):
            samples = tuple(free and not both for free, both in zip(lost, other))
            if modality_pass is not None and any(samples):
                fallbacks.append((modality_pass, samples))
        return tuple(fallbacks)

    def _decode_pass(self, modality_pass: ModalityPass, routed: RoutedInputs, rv_pos: Optional[Tensor],
                     bev_pos: Optional[Tensor], query_embed: Tensor, self_attn_mask: Optional[Tensor],
                     reference_points: Tensor, dn_queries: Optional[DenoisingQueries],
                     img_metas: Sequence[dict]) -> Tuple[List[dict], ...]:
        """Decode the queries against the pass's keys only, with the routing bias of those keys and the pass's
        decoder (its own with ``pass_decoders='separate'``).

        Args:
            modality_pass (ModalityPass): which keys.
            routed (RoutedInputs): features and fused bias from :meth:`route_queries`
                (the camera features the pass decodes).
            rv_pos (Tensor, optional): ``[bs * N, h, w, C]``, of those camera features.
            bev_pos (Tensor, optional): ``[H * W, C]``.
            query_embed (Tensor): ``[bs, P, C]``.
            self_attn_mask (Tensor, optional): ``[P, P]`` DN mask.
            reference_points (Tensor): ``[bs, P, 3]``.
            dn_queries (DenoisingQueries, optional): the DN part of the queries.
            img_metas (Sequence[dict]): ``dropped_modalities`` per sample.

        Returns:
            tuple[list[dict]]: per task predictions, as :meth:`forward`; a
            single-modality pass's first task dict adds ``trained_samples``.
        """
        bev_feat, img_feat, bias = routed.bev_feat, routed.img_feat, routed.cross_attn_bias
        if self.camera_window_prior is not None and self._decodes_camera_only(modality_pass):
            bias = self.camera_prior_bias(reference_points, img_feat, img_metas)
        elif modality_pass is not FUSED:
            num_camera = rv_pos.shape[:3].numel() // query_embed.size(0)  # N * h * w
            bias = restrict_to_keys(bias, *modality_pass.key_range(bev_pos.size(0), num_camera))
        if modality_pass is not FUSED:
            if not modality_pass.uses_lidar:
                bev_feat, bev_pos = None, None
            if not modality_pass.uses_camera:
                img_feat, rv_pos = None, None
        transformer, task_heads = self.transformer, self.task_heads
        if modality_pass.name in self.separate_decoders:
            decoder = self.separate_decoders[modality_pass.name]
            transformer, task_heads = decoder['transformer'], decoder['task_heads']
        outs_dec = self._run_transformer(bev_feat, bev_pos, img_feat, rv_pos, query_embed, self_attn_mask, bias,
                                         transformer)
        preds_dicts = self._task_predictions(torch.nan_to_num(outs_dec), reference_points, dn_queries, task_heads)
        if modality_pass is not FUSED:
            preds_dicts[0][0][TRAINED_SAMPLES_KEY] = trained_samples(modality_pass, img_metas)
        return preds_dicts

    def camera_prior_bias(self, reference_points: Tensor, img_feat: Tensor,
                          img_metas: Sequence[dict]) -> AttentionBias:
        """``camera_window_prior``'s bias over the camera keys.

        Args:
            reference_points (Tensor): ``[bs, P, 3]`` normalised, DN queries first.
            img_feat (Tensor): ``[bs * N, C, h, w]`` camera memory.
            img_metas (Sequence[dict]): ``lidar2img``, ``img_shape``, ``pad_shape``.

        Returns:
            AttentionBias: over the ``P`` queries and ``N * h * w`` camera keys.
        """
        camera_shape = (img_feat.size(0) // reference_points.size(0), *img_feat.shape[-2:])
        return self.camera_window_prior(reference_points, self.pc_range, camera_shape, img_metas)

    def loss(self, gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor], preds_dicts: Sequence[List[dict]],
             gt_num_points: Optional[Sequence[Tensor]] = None) -> Dict[str, Tensor]:
        """Detection losses (see ``CmtHeadLossMixin.loss``), AQR's routing losses and ``image_aux.*`` when enabled.

        Args:
            gt_num_points (Sequence[Tensor], optional): per sample ``[n]`` the
                LiDAR points inside each ground-truth box, needed by AQR's
                per-query routing loss (``needs_gt_point_counts``; the detector
                counts them).
        """
        routing = routing_of(preds_dicts)
        matched_objects = [] if routing is not None and self.needs_gt_point_counts else None
        losses = super().loss(gt_bboxes_3d, gt_labels_3d, preds_dicts, matched_objects=matched_objects)
        losses.update(self.routing_loss(routing, matched_objects, gt_bboxes_3d, gt_num_points))
        image_aux = preds_dicts[0][0].get(IMAGE_AUX_KEY)
        if image_aux is not None:
            aux_losses = self.image_aux_head.loss(image_aux, gt_bboxes_3d, gt_labels_3d)
            losses.update({IMAGE_AUX_PREFIX + name: value for name, value in aux_losses.items()})
        if self.fused_image_drop_prob > 0:  # logged at every step, 0 when no sample was drawn
            black = sum(preds_dicts[0][0].get(FUSED_BLACK_SAMPLES_KEY, ()))
            losses['fused.num_black_camera_samples'] = torch.full((), float(black),
                                                                  device=preds_dicts[0][0]['cls_logits'].device)
        return losses

    def _bev_input(self, pts_feats: Sequence[Optional[Tensor]]) -> Optional[Tensor]:
        if not pts_feats or pts_feats[0] is None:
            raise ValueError(f'{type(self).__name__} needs LiDAR BEV features (pts_feats[0])')
        bev_feat = self.shared_conv(pts_feats[0])
        self._check_bev_size(*bev_feat.shape[-2:])
        return bev_feat

    def _camera_input(self, img_feats: Sequence[Optional[Tensor]]) -> Optional[Tensor]:
        if not img_feats or img_feats[0] is None:
            raise ValueError(f'{type(self).__name__} needs camera features (img_feats[0])')
        return img_feats[0]

    def _run_transformer(self, bev_feat: Optional[Tensor], bev_pos: Optional[Tensor], img_feat: Optional[Tensor],
                         rv_pos: Optional[Tensor], query_embed: Tensor, self_attn_mask: Optional[Tensor],
                         cross_attn_bias, transformer: nn.Module) -> Tensor:
        """Decoder outputs ``[L, bs, P, C]`` of ``transformer`` (the head's, or a pass's own)."""
        outs_dec, _ = transformer(bev_feat, img_feat, query_embed, bev_pos, rv_pos,
                                       self_attn_mask=self_attn_mask, cross_attn_bias=cross_attn_bias)
        return outs_dec

    def _task_predictions(self, outs_dec: Tensor, reference_points: Tensor, dn_queries: Optional[DenoisingQueries],
                          task_heads: ModuleList) -> Tuple[List[dict], ...]:
        reference = inverse_sigmoid(reference_points)
        low = device_constant(self.pc_range[:3], reference_points.device, reference_points.dtype)
        extent = device_constant(self.pc_range[3:6], reference_points.device, reference_points.dtype) - low
        pad_size = dn_queries.pad_size if dn_queries is not None else 0
        preds_dicts = []
        for task_head in task_heads:
            outs = task_head(outs_dec)
            outs['center'] = (outs['center'] + reference[..., :2]).sigmoid() * extent[:2] + low[:2]
            outs['height'] = (outs['height'] + reference[..., 2:3]).sigmoid() * extent[2:] + low[2:]
            if self.training:
                for key in list(outs):
                    if pad_size:
                        outs['dn_' + key] = outs[key][:, :, :pad_size]
                    outs[key] = outs[key][:, :, pad_size:]
                outs['dn_queries'] = dn_queries
            preds_dicts.append([outs])
        return tuple(preds_dicts)

    # ------------------------------------------------------------------ inference
    @force_fp32(apply_to=('preds_dicts', ))
    def get_bboxes(self, preds_dicts: Sequence[List[dict]], img_metas: Sequence[dict], img: Optional[Tensor] = None,
                   rescale: bool = False) -> List[list]:
        """Decode the last decoder layer into boxes (NMS-free).

        Args:
            preds_dicts: output of :meth:`forward`.
            img_metas (Sequence[dict]): ``box_type_3d`` per sample (default
                ``LiDARInstance3DBoxes``).
            img, rescale: unused (mmdet3d's interface).

        Returns:
            list[list]: per sample ``[boxes (box_type_3d, bottom centre,
            9-dim), scores [N], labels [N]]``.
        """
        results = []
        for meta, decoded in zip(img_metas, self.bbox_coder.decode(preds_dicts)):
            bboxes = decoded['bboxes'].clone()
            bboxes[:, 2] = bboxes[:, 2] - bboxes[:, 5] * 0.5
            box_type = meta.get('box_type_3d', LiDARInstance3DBoxes)
            results.append([box_type(bboxes, box_dim=bboxes.size(-1)), decoded['scores'], decoded['labels']])
        return results


@HEADS.register_module()
class CmtLidarHead(CmtHead):
    """LiDAR-only head: queries attend to BEV tokens; no ``rv_embedding``."""

    uses_camera = False

    def _camera_input(self, img_feats: Sequence[Optional[Tensor]]) -> None:
        if img_feats and img_feats[0] is not None:
            raise ValueError('CmtLidarHead uses no camera features, but img_feats were given; use CmtHead for '
                             'fusion')
        return None

    def _run_transformer(self, bev_feat: Tensor, bev_pos: Tensor, img_feat: None, rv_pos: None,
                         query_embed: Tensor, self_attn_mask: Optional[Tensor], cross_attn_bias,
                         transformer: nn.Module) -> Tensor:
        outs_dec, _ = transformer(bev_feat, query_embed, bev_pos, self_attn_mask=self_attn_mask,
                                       cross_attn_bias=cross_attn_bias)
        return outs_dec


@HEADS.register_module()
class CmtImageHead(CmtHead):
    """Camera-only head: queries attend to camera tokens; no ``shared_conv``.

    Its one pass decodes camera tokens only, so ``camera_window_prior`` (see
    :class:`CmtHead`) biases it.
    """

    uses_lidar = False

    def _bev_input(self, pts_feats: Sequence[Optional[Tensor]]) -> None:
        if pts_feats and pts_feats[0] is not None:
            raise ValueError('CmtImageHead uses no LiDAR features, but pts_feats were given; use CmtHead for '
                             'fusion')
        return None

    def _run_transformer(self, bev_feat: None, bev_pos: None, img_feat: Tensor, rv_pos: Tensor,
                         query_embed: Tensor, self_attn_mask: Optional[Tensor], cross_attn_bias,
                         transformer: nn.Module) -> Tensor:
        outs_dec, _ = transformer(img_feat, query_embed, rv_pos, self_attn_mask=self_attn_mask,
                                       cross_attn_bias=cross_attn_bias)
        return outs_dec
