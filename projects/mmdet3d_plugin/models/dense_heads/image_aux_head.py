"""2D auxiliary supervision of the camera feature map: centre heatmaps and object depth.

``CmtHead(image_aux_config=dict(type='ImageAuxHead', ...))`` runs this head on
the camera feature map ``img_feats[0]`` (``[bs * N, C, h, w]``) in training
and adds its losses, ``image_aux.loss_heatmap`` and ``image_aux.loss_depth``,
so that the camera features learn where objects are in each image and how
far away (CMT's detection loss alone teaches them little of either). A
``3x3`` conv + BN + ReLU stem feeds two ``1x1`` branches:

* ``heatmap`` ``[bs * N, K, h, w]`` (logits): CenterNet Gaussian heatmaps of
  the projected gravity centres of ``gt_bboxes_3d`` (one channel per global
  class, peak 1 on the cell of the centre, radius from the projected 2D box
  in cells), trained with ``GaussianFocalLoss`` averaged over the visible
  (view, object) pairs (at least 1).
* ``log_depth`` ``[bs * N, 1, h, w]``: log of the camera depth (metres) of the
  object covering each cell, the nearest where 2D boxes (of the 8 projected
  corners, clipped to the image) overlap; L1 loss on **log depth**, averaged
  over the covered cells only. ``depth = exp(log_depth)`` (clamped to
  ``[min_depth, 1000]`` m) is what ``camera_depth_position`` lifts tokens with.

Samples whose images did not arrive whole (dropped by ``ModalMask3D``, or
changed by a sensor corruption of the training pipeline: the camera pass's
:func:`~.pass_plan.trained_samples`) weigh 0 in both losses. The target
geometry is in :mod:`..utils.image_targets`.
"""
import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
from mmcv.cnn import ConvModule
from mmcv.runner import BaseModule
from mmdet.models.builder import HEADS, build_loss
from torch import Tensor, nn

from ...utils.host_data import host_to_device
from ..utils.camera_geometry import CameraGeometry
from ..utils.image_targets import (centre_heatmap_targets, object_depth_targets, project_box_centres,
                                   project_box_extents)
from .pass_plan import MODALITY_PASSES, trained_samples

#: prefix of the aux losses in CmtHead's loss dict
IMAGE_AUX_PREFIX = 'image_aux.'
MAX_DEPTH = 1000.0


@dataclass
class ImageAuxOutputs:
    """Predictions of :class:`ImageAuxHead` and the camera metas their targets need.

    Attributes:
        heatmap (Tensor): ``[bs * N, K, h, w]`` logits.
        log_depth (Tensor, optional): ``[bs * N, 1, h, w]`` (None without a depth branch).
        depth (Tensor, optional): ``[bs * N, 1, h, w]`` metres, ``exp(log_depth)`` clamped.
        lidar2img (Tensor): ``[bs, N, 4, 4]``.
        pad_hw (tuple[float, float]): padded image size.
        trained (tuple[bool, ...]): per sample, whether its images were there.
    """

    heatmap: Tensor
    log_depth: Optional[Tensor]
    depth: Optional[Tensor]
    lidar2img: Tensor
    pad_hw: Tuple[float, float]
    trained: Tuple[bool, ...]

    def first_samples(self, num_samples: int) -> 'ImageAuxOutputs':
        """The outputs of the batch's first ``num_samples`` samples (all their views)."""
        num_views = self.lidar2img.size(1) * num_samples
        return ImageAuxOutputs(
            heatmap=self.heatmap[:num_views],
            log_depth=None if self.log_depth is None else self.log_depth[:num_views],
            depth=None if self.depth is None else self.depth[:num_views], lidar2img=self.lidar2img[:num_samples],
            pad_hw=self.pad_hw, trained=self.trained[:num_samples])


@HEADS.register_module()
class ImageAuxHead(BaseModule):
    """Centre-heatmap and depth branches on the camera feature map (see the module docstring).

    Args:
        in_channels (int): channels of the camera feature map (CmtHead sets
            its ``hidden_dim``).
        num_classes (int): heatmap channels K (CmtHead sets its number of classes).
        feat_channels (int): channels of the shared stem.
        loss_heatmap (dict): heatmap loss (``GaussianFocalLoss``, weight 1.0).
        loss_depth (dict, optional): L1 loss on log depth (weight 0.5); None:
            no depth branch (then ``camera_depth_position`` is unavailable).
        gaussian_overlap (float): ``min_overlap`` of the Gaussian radius.
        min_radius (int): smallest Gaussian radius in cells.
        min_depth (float): points at most this deep (m) are behind the camera.
        init_depth (float): depth (m) the depth branch predicts at initialisation.
        init_cfg (dict, optional): mmcv init config.
    """

    def __init__(self,
                 in_channels: int,
                 num_classes: int,
                 feat_channels: int = 64,
                 loss_heatmap: dict = dict(type='GaussianFocalLoss', reduction='mean', loss_weight=1.0),
                 loss_depth: Optional[dict] = dict(type='L1Loss', reduction='mean', loss_weight=0.5),
                 gaussian_overlap: float = 0.1,
                 min_radius: int = 1,
                 min_depth: float = 0.1,
                 init_depth: float = 10.0,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.num_classes = num_classes
        self.gaussian_overlap = gaussian_overlap
        self.min_radius = min_radius
        self.min_depth = min_depth
        self.init_depth = init_depth
        self.stem = ConvModule(in_channels, feat_channels, kernel_size=3, padding=1, conv_cfg=dict(type='Conv2d'),
                               norm_cfg=dict(type='BN2d'))
        self.heatmap = nn.Conv2d(feat_channels, num_classes, kernel_size=1)
        self.loss_heatmap = build_loss(loss_heatmap)
        self.with_depth = loss_depth is not None
        if self.with_depth:
            self.depth = nn.Conv2d(feat_channels, 1, kernel_size=1)
            self.loss_depth = build_loss(loss_depth)

    def init_weights(self) -> None:
        """Children's initialisation, then CenterNet's heatmap prior (0.1) and the initial depth."""
        super().init_weights()
        nn.init.constant_(self.heatmap.bias, -2.19)
        if self.with_depth:
            nn.init.constant_(self.depth.bias, math.log(self.init_depth))

    def forward(self, img_feat: Tensor, img_metas: Sequence[dict], geometry: CameraGeometry) -> ImageAuxOutputs:
        """Predict heatmaps and depths of ``img_feat`` ``[bs * N, C, h, w]``.

        Args:
            img_feat (Tensor): ``[bs * N, C, h, w]``.
            img_metas (Sequence[dict]): (optionally) ``dropped_modalities`` and ``corruption`` per sample.
            geometry (CameraGeometry): the ``bs`` samples' cameras (``lidar2img``, ``pad_hw``).

        Returns:
            ImageAuxOutputs: predictions and the geometry the loss reads.
        """
        lidar2img = geometry.lidar2img
        if lidar2img.shape[:2].numel() != img_feat.size(0):
            raise ValueError(f'img_metas describe {lidar2img.size(0)} samples x {lidar2img.size(1)} views but the '
                             f'camera features have {img_feat.size(0)} maps')
        feat = self.stem(img_feat)
        log_depth = depth = None
        if self.with_depth:
            log_depth = self.depth(feat)
            depth = log_depth.clamp(math.log(self.min_depth), math.log(MAX_DEPTH)).exp()
        return ImageAuxOutputs(heatmap=self.heatmap(feat), log_depth=log_depth, depth=depth, lidar2img=lidar2img,
                               pad_hw=geometry.pad_hw,
                               trained=trained_samples(MODALITY_PASSES['camera'], img_metas))

    def targets(self, outputs: ImageAuxOutputs, gt_bboxes_3d: Sequence,
                gt_labels_3d: Sequence[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Targets of every view of the batch.

        Args:
            outputs (ImageAuxOutputs): from :meth:`forward`.
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample.
            gt_labels_3d (Sequence[Tensor]): per sample global class indices.

        Returns:
            tuple[Tensor, Tensor, Tensor, Tensor]: ``heatmap`` ``[bs * N, K, h, w]``,
            ``num_visible`` ``[bs * N]`` (visible centres per view),
            ``depth`` ``[bs * N, h, w]`` metres and ``covered`` ``[bs * N, h, w]`` bool.
        """
        feat_hw = tuple(outputs.heatmap.shape[-2:])
        device = outputs.heatmap.device
        heatmaps, num_visible, depths, covered = [], [], [], []
        for boxes, labels, lidar2img in zip(gt_bboxes_3d, gt_labels_3d, outputs.lidar2img):
            pixels, depth, visible = project_box_centres(boxes.gravity_center.to(device), lidar2img, outputs.pad_hw,
                                                         self.min_depth)
            extents, valid = project_box_extents(boxes.corners.to(device), lidar2img, outputs.pad_hw,
                                                 self.min_depth)
            heatmaps.append(centre_heatmap_targets(pixels, extents, visible, labels.to(device), self.num_classes,
                                                   feat_hw, outputs.pad_hw, self.gaussian_overlap, self.min_radius))
            num_visible.append(visible.sum(dim=1))
            sample_depth, sample_covered = object_depth_targets(extents, depth, valid & (depth > self.min_depth),
                                                                feat_hw, outputs.pad_hw)
            depths.append(sample_depth)
            covered.append(sample_covered)
        return torch.cat(heatmaps), torch.cat(num_visible), torch.cat(depths), torch.cat(covered)

    def loss(self, outputs: ImageAuxOutputs, gt_bboxes_3d: Sequence,
             gt_labels_3d: Sequence[Tensor]) -> Dict[str, Tensor]:
        """``loss_heatmap`` (and ``loss_depth`` with a depth branch); dropped-image samples weigh 0.

        Args:
            outputs (ImageAuxOutputs): from :meth:`forward` on the same batch.
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample.
            gt_labels_3d (Sequence[Tensor]): per sample global class indices.

        Returns:
            dict[str, Tensor]: scalar losses.
        """
        heatmap, num_visible, depth, covered = self.targets(outputs, gt_bboxes_3d, gt_labels_3d)
        num_views = outputs.lidar2img.size(1)
        view_weight = host_to_device(outputs.trained, heatmap.device, heatmap.dtype).repeat_interleave(num_views)
        pred = outputs.heatmap.float().sigmoid().clamp(1e-4, 1 - 1e-4)
        losses = dict(loss_heatmap=self.loss_heatmap(
            pred, heatmap, view_weight[:, None, None, None].expand_as(pred),
            avg_factor=(num_visible * view_weight).sum().clamp(min=1)))
        if self.with_depth:
            weight = covered * view_weight[:, None, None]
            target = depth.clamp(min=self.min_depth).log()
            losses['loss_depth'] = self.loss_depth(outputs.log_depth[:, 0].float(), target, weight,
                                                   avg_factor=weight.sum().clamp(min=1))
        return losses
