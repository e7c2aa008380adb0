"""Dense auxiliary supervision of the BEV memory: centre heatmaps, heading and velocity at each object's cell.

``CmtHead(aids=dict(bev_aux_config=dict(type='BevAuxHead', ...)))`` runs
this head in training on the BEV memory the decoder attends to (the output of
``shared_conv``, ``[bs, C, H, W]``) and adds ``bev_aux.loss_heatmap``,
``bev_aux.loss_heading`` and ``bev_aux.loss_velocity``. CMT's decoder reads an
object's heading and motion only through attention, which in a short training
teaches the BEV features little of either; these losses ask every cell that
holds an object's centre to say them (CenterPoint's dense targets). A ``3x3``
conv + BN + ReLU stem feeds two ``1x1`` branches:

* ``heatmap`` ``[bs, K, H, W]`` (logits): Gaussian heatmaps of the BEV
  gravity centres (one channel per global class, radius from the box's BEV
  extent in cells), ``GaussianFocalLoss`` averaged over the objects;
* ``regression`` ``[bs, 4, H, W]``: ``(sin yaw, cos yaw, vx, vy)`` at the cell
  of each centre, L1 averaged over the objects (heading and velocity weighted
  apart; the heading loss also compares the box axis, ``heading_axis``, which
  the L1 on ``(sin, cos)`` alone does not reward).

The cell size comes from ``pc_range`` and the map's size. Samples whose points did
not arrive whole (dropped by ``ModalMask3D`` or changed by a training-time sensor
corruption) weigh 0. With ``detach_input`` the losses train this head only, not
the BEV features the decoder reads. With ``heading_at_inference`` (``velocity_at_inference``)
it also runs at test time: each box of a sample with points takes its yaw (velocity)
from the maps at its centre (:meth:`BevAuxHead.regression_at`).
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmcv.runner import BaseModule
from mmdet.models.builder import HEADS, build_loss
from torch import Tensor, nn

from ...utils.host_data import host_to_device
from ..utils.image_targets import centre_heatmap_targets
from ...core.bbox.util import AXIS_EPS, heading_axis
from .pass_plan import MODALITY_PASSES, trained_samples

#: prefix of the aux losses in CmtHead's loss dict
BEV_AUX_PREFIX = 'bev_aux.'


@dataclass
class BevAuxOutputs:
    """Predictions of :class:`BevAuxHead` and the samples that train them.

    Attributes:
        heatmap (Tensor): ``[bs, K, H, W]`` logits.
        regression (Tensor): ``[bs, 4, H, W]`` ``(sin, cos, vx, vy)``.
        trained (tuple[bool, ...]): per sample, whether its points were there (at inference: whether the fused
            pass decoded it, so that its boxes take this head's heading).
    """

    heatmap: Tensor
    regression: Tensor
    trained: Tuple[bool, ...]


@HEADS.register_module()
class BevAuxHead(BaseModule):
    """Heatmap, heading and velocity branches on the BEV memory (see the module docstring).

    Args:
        in_channels (int): channels of the BEV memory (CmtHead sets its ``hidden_dim``).
        num_classes (int): heatmap channels K (CmtHead sets its number of classes).
        pc_range (Sequence[float]): ``[x0, y0, z0, x1, y1, z1]`` the map covers (CmtHead sets its own).
        feat_channels (int): channels of the shared stem.
        loss_heatmap (dict): heatmap loss.
        loss_heading (dict): L1 loss on ``(sin, cos)``.
        loss_velocity (dict): L1 loss on ``(vx, vy)`` in m/s.
        gaussian_overlap (float): ``min_overlap`` of the Gaussian radius.
        min_radius (int): smallest Gaussian radius in cells.
        detach_input (bool): train this head on a detached BEV memory (its losses leave the decoder's features alone).
        heading_at_inference (bool): the boxes' yaw comes from this head's heading map (``CmtHead.get_bboxes``).
        velocity_at_inference (bool): the boxes' ``(vx, vy)`` come from this head's velocity map.
        init_cfg (dict, optional): mmcv init config.
    """

    def __init__(self,
                 in_channels: int,
                 num_classes: int,
                 pc_range: Sequence[float],
                 feat_channels: int = 64,
                 loss_heatmap: dict = dict(type='GaussianFocalLoss', reduction='mean', loss_weight=1.0),
                 loss_heading: dict = dict(type='L1Loss', reduction='mean', loss_weight=1.0),
                 loss_velocity: dict = dict(type='L1Loss', reduction='mean', loss_weight=0.25),
                 gaussian_overlap: float = 0.1,
                 min_radius: int = 1,
                 detach_input: bool = False,
                 heading_at_inference: bool = False,
                 velocity_at_inference: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if len(pc_range) != 6 or pc_range[3] <= pc_range[0] or pc_range[4] <= pc_range[1]:
            raise ValueError(f'BevAuxHead: pc_range must be [x0, y0, z0, x1, y1, z1] with x1 > x0, y1 > y0, '
                             f'got {list(pc_range)}')
        self.num_classes = num_classes
        self.pc_range = [float(value) for value in pc_range]
        self.gaussian_overlap = gaussian_overlap
        self.min_radius = min_radius
        self.detach_input = detach_input
        self.heading_at_inference = heading_at_inference
        self.velocity_at_inference = velocity_at_inference
        self.stem = ConvModule(in_channels, feat_channels, kernel_size=3, padding=1, conv_cfg=dict(type='Conv2d'),
                               norm_cfg=dict(type='BN2d'))
        self.heatmap = nn.Conv2d(feat_channels, num_classes, kernel_size=1)
        self.regression = nn.Conv2d(feat_channels, 4, kernel_size=1)
        self.loss_heatmap = build_loss(loss_heatmap)
        self.loss_heading = build_loss(loss_heading)
        self.loss_velocity = build_loss(loss_velocity)

    def init_weights(self) -> None:
        """Children's initialisation, then CenterNet's heatmap prior (0.1)."""
        super().init_weights()
        nn.init.constant_(self.heatmap.bias, -2.19)

    def forward(self, bev_feat: Tensor, img_metas: Sequence[dict]) -> BevAuxOutputs:
        """Predict the heatmaps and ``(sin, cos, vx, vy)`` maps of ``bev_feat`` ``[bs, C, H, W]``."""
        if bev_feat.size(0) != len(img_metas):
            raise ValueError(f'{len(img_metas)} img_metas for a BEV map of batch {bev_feat.size(0)}')
        feat = self.stem(bev_feat.detach() if self.detach_input else bev_feat)
        return BevAuxOutputs(heatmap=self.heatmap(feat), regression=self.regression(feat),
                             trained=trained_samples(MODALITY_PASSES['lidar'], img_metas))

    @property
    def runs_at_inference(self) -> bool:
        """Whether the boxes take a field from this head's maps at test time."""
        return self.heading_at_inference or self.velocity_at_inference

    def regression_at(self, outputs: BevAuxOutputs, centres: Sequence[Tensor]) -> List[Tensor]:
        """Per sample ``[n, 3]`` ``(yaw, vx, vy)`` of the maps at ``[n, >=2]`` BEV centres in metres (bilinear,
        the edge cells beyond the map; yaw the ``atan2`` of ``(sin, cos)``)."""
        low, high = self.pc_range[:2], self.pc_range[3:5]
        fields = []
        for sample, xy in enumerate(centres):
            grid = torch.stack([(xy[:, axis] - low[axis]) / (high[axis] - low[axis]) * 2 - 1 for axis in (0, 1)], -1)
            values = F.grid_sample(outputs.regression[sample:sample + 1].float(), grid.float().view(1, 1, -1, 2),
                                   padding_mode='border', align_corners=False)[0, :, 0]  # [4, n]
            yaw = torch.atan2(values[0], values[1])
            fields.append(torch.stack([yaw, values[2], values[3]], dim=-1).to(xy.dtype))
        return fields

    def targets(self, map_hw: Tuple[int, int], gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor],
                device: torch.device) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Targets of the batch on an ``(H, W)`` map.

        Returns:
            tuple[Tensor, Tensor, Tensor, Tensor]: ``heatmap`` ``[bs, K, H, W]``;
            for the ``n`` objects of the batch whose centre is on the map:
            ``flat_index`` ``[n]`` (``b * H * W + y * W + x``), ``regression``
            ``[n, 4]`` ``(sin, cos, vx, vy)`` and ``sample`` ``[n]`` their sample.
        """
        height, width = map_hw
        low = torch.tensor(self.pc_range[:2], device=device)
        extent = torch.tensor(self.pc_range[3:5], device=device) - low
        cell = extent / torch.tensor([width, height], device=device, dtype=extent.dtype)
        heatmaps, flat_index, regression, sample = [], [], [], []
        for b, (boxes, labels) in enumerate(zip(gt_bboxes_3d, gt_labels_3d)):
            centres = boxes.gravity_center[:, :2].to(device) - low
            corners = boxes.corners[:, :, :2].to(device) - low
            extents = torch.cat([corners.min(dim=1).values, corners.max(dim=1).values], dim=-1)
            on_map = ((centres >= 0) & (centres < extent)).all(dim=-1)
            heatmaps.append(centre_heatmap_targets(centres[None], extents[None], on_map[None], labels.to(device),
                                                   self.num_classes, (height, width),
                                                   (float(extent[1]), float(extent[0])), self.gaussian_overlap,
                                                   self.min_radius))
            cells = torch.div(centres[on_map], cell, rounding_mode='floor').long()
            flat_index.append(b * height * width + cells[:, 1] * width + cells[:, 0])
            tensor = boxes.tensor.to(device)[on_map]
            yaw = tensor[:, 6]
            velocity = tensor[:, 7:9] if tensor.size(1) >= 9 else tensor.new_zeros(len(tensor), 2)
            regression.append(torch.cat([yaw.sin()[:, None], yaw.cos()[:, None], velocity], dim=-1))
            sample.append(torch.full_like(yaw, b, dtype=torch.long))
        return torch.cat(heatmaps), torch.cat(flat_index), torch.cat(regression), torch.cat(sample)

    def loss(self, outputs: BevAuxOutputs, gt_bboxes_3d: Sequence,
             gt_labels_3d: Sequence[Tensor]) -> Dict[str, Tensor]:
        """``loss_heatmap``, ``loss_heading`` and ``loss_velocity``; samples without whole points weigh 0.

        Args:
            outputs (BevAuxOutputs): from :meth:`forward` on the same batch.
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample, with velocity.
            gt_labels_3d (Sequence[Tensor]): per sample global class indices.

        Returns:
            dict[str, Tensor]: scalar losses.
        """
        device = outputs.heatmap.device
        heatmap, flat_index, target, sample = self.targets(tuple(outputs.heatmap.shape[-2:]), gt_bboxes_3d,
                                                           gt_labels_3d, device)
        sample_weight = host_to_device(outputs.trained, device, heatmap.dtype)
        object_weight = sample_weight[sample]
        num_objects = object_weight.sum().clamp(min=1)
        pred = outputs.heatmap.float().sigmoid().clamp(1e-4, 1 - 1e-4)
        loss_heatmap = self.loss_heatmap(pred, heatmap, sample_weight[:, None, None, None].expand_as(pred),
                                         avg_factor=num_objects)
        regression = outputs.regression.float().permute(0, 2, 3, 1).reshape(-1, 4)[flat_index]
        weight = object_weight[:, None].expand(-1, 2)
        heading = self.loss_heading(regression[:, :2], target[:, :2], weight, avg_factor=num_objects)
        axis = self.loss_heading(heading_axis(regression[:, :2], AXIS_EPS), heading_axis(target[:, :2]), weight,
                                 avg_factor=num_objects)
        return dict(loss_heatmap=loss_heatmap, loss_heading=heading + axis,
                    loss_velocity=self.loss_velocity(regression[:, 2:], target[:, 2:], weight,
                                                     avg_factor=num_objects))
