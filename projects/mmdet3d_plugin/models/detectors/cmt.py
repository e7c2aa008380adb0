"""``CmtDetector``: the Cross Modal Transformer detector (Yan et al., ICCV 2023).

An mmdet3d ``MVXTwoStageDetector`` whose LiDAR branch (spconv-2
voxelization -> ``HardSimpleVFE`` -> ``SparseEncoder`` -> ``SECOND`` ->
``SECONDFPN``) and camera branch (backbone -> ``CPFPN``) both feed one
query-based head (``CmtHead`` and its LiDAR-only / camera-only variants).
Either branch may be absent from the config (LiDAR-only, camera-only).
"""
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from mmcv.runner import auto_fp16, force_fp32
from mmdet.models.builder import DETECTORS
from mmdet3d.core import bbox3d2result
from mmdet3d.models.detectors.mvx_two_stage import MVXTwoStageDetector
from torch import Tensor

from ..utils.grid_mask import GridMask
from ..utils.spconv_voxelize import SPConvVoxelization


@DETECTORS.register_module()
class CmtDetector(MVXTwoStageDetector):
    """CMT detector.

    Args:
        use_grid_mask (bool): apply GridMask to the images in training (the
            upstream setting: horizontal and vertical stripes, ratio 0.5,
            mode 1, probability 0.7).
        pts_voxel_layer (dict, optional): :class:`SPConvVoxelization` arguments
            (``voxel_size``, ``point_cloud_range``, ``max_num_points``,
            ``max_voxels``, ``num_point_features``); built here with spconv 2,
            which runs on CPU and GPU, instead of mmcv's ``Voxelization``.
        **kwargs: the other ``MVXTwoStageDetector`` arguments
            (``pts_voxel_encoder``, ``pts_middle_encoder``, ``pts_backbone``,
            ``pts_neck``, ``img_backbone``, ``img_neck``, ``pts_bbox_head``,
            ``train_cfg``, ``test_cfg``, ``init_cfg``, ...).
    """

    def __init__(self, use_grid_mask: bool = False, pts_voxel_layer: Optional[dict] = None, **kwargs) -> None:
        super().__init__(pts_voxel_layer=None, **kwargs)
        self.use_grid_mask = use_grid_mask
        if use_grid_mask:
            self.grid_mask = GridMask(True, True, rotate=1, offset=False, ratio=0.5, mode=1, prob=0.7)
        if pts_voxel_layer:
            self.pts_voxel_layer = SPConvVoxelization(**pts_voxel_layer)

    @auto_fp16(apply_to=('img', ), out_fp32=True)
    def extract_img_feat(self, img: Optional[Tensor], img_metas: Sequence[dict]) -> Optional[List[Tensor]]:
        """Camera features.

        Args:
            img (Tensor, optional): ``[bs, N, 3, H, W]`` (or ``[bs * N, 3, H, W]``).
            img_metas (Sequence[dict]): per sample; ``input_shape`` ``(H, W)`` is written into each.

        Returns:
            list[Tensor] | None: the neck's levels ``[bs * N, C, h, w]``, finest first.
        """
        if img is None or not self.with_img_backbone:
            return None
        if img.dim() == 5:
            img = img.flatten(0, 1)
        elif img.dim() != 4:
            raise ValueError(f'img must be [bs, N, C, H, W] or [bs * N, C, H, W], got {tuple(img.shape)}')
        for meta in img_metas:
            meta.update(input_shape=tuple(img.shape[-2:]))
        if self.use_grid_mask:
            img = self.grid_mask(img)
        feats = self.img_backbone(img)
        if isinstance(feats, dict):
            feats = list(feats.values())
        if self.with_img_neck:
            feats = self.img_neck(feats)
        return list(feats)

    @force_fp32(apply_to=('points', 'img_feats'))
    def extract_pts_feat(self, points: Optional[Sequence[Tensor]], img_feats: Optional[List[Tensor]],
                         img_metas: Sequence[dict]) -> Optional[List[Tensor]]:
        """BEV features ``[bs, C, H, W]`` (a list with the neck's levels), or None without LiDAR."""
        if points is None or not self.with_pts_bbox or not hasattr(self, 'pts_voxel_encoder'):
            return None
        voxels, num_points, coors = self.voxelize(points)
        voxel_features = self.pts_voxel_encoder(voxels, num_points, coors)
        x = self.pts_middle_encoder(voxel_features, coors, len(points))
        x = self.pts_backbone(x)
        if self.with_pts_neck:
            x = self.pts_neck(x)
        return list(x)

    @torch.no_grad()
    @force_fp32()
    def voxelize(self, points: Sequence[Tensor]):
        """Voxelize every sample.

        Args:
            points (Sequence[Tensor]): per sample ``[P_i, num_point_features]``.

        Returns:
            tuple[Tensor, Tensor, Tensor]: voxels ``[M, max_points, F]``, points
            per voxel ``[M]``, coordinates ``[M, 4]`` ``(sample, z, y, x)``.
        """
        if not hasattr(self, 'pts_voxel_layer'):
            raise RuntimeError('CmtDetector has LiDAR encoders but no pts_voxel_layer in its config')
        voxels, coors, num_points = [], [], []
        for sample, sample_points in enumerate(points):
            sample_voxels, sample_coors, sample_num = self.pts_voxel_layer(sample_points)
            voxels.append(sample_voxels)
            coors.append(F.pad(sample_coors, (1, 0), mode='constant', value=sample))
            num_points.append(sample_num)
        num_voxels = sum(len(v) for v in voxels)
        if num_voxels == 0:
            raise ValueError('no LiDAR point of the batch lies inside point_cloud_range: the sparse encoder has '
                             'nothing to encode (drop the LiDAR input, or use a camera-only config)')
        if num_voxels == 1 and self.training:
            raise ValueError('the batch has a single non-empty voxel, and the sparse encoder\'s BatchNorm needs '
                             'two values per channel in training (a dropped LiDAR input, ModalMask3D, with '
                             'samples_per_gpu=1?); train with samples_per_gpu >= 2')
        return torch.cat(voxels), torch.cat(num_points), torch.cat(coors)

    def forward_train(self,
                      points: Optional[Sequence[Tensor]] = None,
                      img_metas: Optional[Sequence[dict]] = None,
                      gt_bboxes_3d: Optional[Sequence] = None,
                      gt_labels_3d: Optional[Sequence[Tensor]] = None,
                      img: Optional[Tensor] = None,
                      gt_bboxes_ignore: Optional[Sequence[Tensor]] = None) -> Dict[str, Tensor]:
        """Losses of one batch.

        Args:
            points (Sequence[Tensor], optional): per sample ``[P_i, F]``.
            img_metas (Sequence[dict]): per sample (``lidar2img``, ``pad_shape``, ...).
            gt_bboxes_3d (Sequence[LiDARInstance3DBoxes]): per sample, with velocity.
            gt_labels_3d (Sequence[Tensor]): per sample class indices.
            img (Tensor, optional): ``[bs, N, 3, H, W]``.
            gt_bboxes_ignore: not supported; must be None.

        Returns:
            dict[str, Tensor]: the head's losses.
        """
        if gt_bboxes_ignore is not None:
            raise ValueError('CmtDetector does not support gt_bboxes_ignore')
        if gt_bboxes_3d is None or gt_labels_3d is None:
            raise ValueError('CmtDetector.forward_train needs gt_bboxes_3d and gt_labels_3d')
        img_feats, pts_feats = self.extract_feat(points, img=img, img_metas=img_metas)
        return self.forward_pts_train(pts_feats, img_feats, gt_bboxes_3d, gt_labels_3d, img_metas)

    @force_fp32(apply_to=('pts_feats', 'img_feats'))
    def forward_pts_train(self, pts_feats: Optional[List[Tensor]], img_feats: Optional[List[Tensor]],
                          gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor],
                          img_metas: Sequence[dict]) -> Dict[str, Tensor]:
        """Head forward (with denoising queries) and losses."""
        outs = self.pts_bbox_head(pts_feats or [None], img_feats or [None], img_metas, gt_bboxes_3d, gt_labels_3d)
        return self.pts_bbox_head.loss(gt_bboxes_3d, gt_labels_3d, outs)

    def forward_test(self, points: Optional[list] = None, img_metas: Optional[list] = None,
                     img: Optional[list] = None, **kwargs) -> List[dict]:
        """Test entry of mmdet3d's ``forward(return_loss=False)``.

        Args:
            points (list[list[Tensor]], optional): test-time augmentations x samples.
            img_metas (list[list[dict]]): test-time augmentations x samples.
            img (list[Tensor], optional): test-time augmentations of ``[bs, N, 3, H, W]``.
            **kwargs: passed to :meth:`simple_test` (``rescale``).

        Returns:
            list[dict]: per sample ``dict(pts_bbox=dict(boxes_3d, scores_3d, labels_3d))``.
        """
        if img_metas is None:
            raise ValueError('CmtDetector.forward_test needs img_metas')
        for value, name in ((points, 'points'), (img, 'img'), (img_metas, 'img_metas')):
            if value is not None and not isinstance(value, list):
                raise TypeError(f'{name} must be a list of test-time augmentations, got {type(value)}')
        if len(img_metas) != 1:
            return self.aug_test(points, img_metas, img, **kwargs)
        return self.simple_test(points[0] if points is not None else None, img_metas[0],
                                img[0] if img is not None else None, **kwargs)

    @force_fp32(apply_to=('pts_feats', 'img_feats'))
    def simple_test_pts(self, pts_feats: Optional[List[Tensor]], img_feats: Optional[List[Tensor]],
                        img_metas: Sequence[dict], rescale: bool = False) -> List[dict]:
        """Boxes of every sample as ``bbox3d2result`` dicts."""
        outs = self.pts_bbox_head(pts_feats or [None], img_feats or [None], img_metas)
        bbox_list = self.pts_bbox_head.get_bboxes(outs, img_metas, rescale=rescale)
        return [bbox3d2result(bboxes, scores, labels) for bboxes, scores, labels in bbox_list]

    def simple_test(self, points: Optional[Sequence[Tensor]], img_metas: Sequence[dict],
                    img: Optional[Tensor] = None, rescale: bool = False) -> List[dict]:
        """Detect without test-time augmentation.

        Returns:
            list[dict]: per sample ``dict(pts_bbox=dict(boxes_3d, scores_3d, labels_3d))``.
        """
        img_feats, pts_feats = self.extract_feat(points, img=img, img_metas=img_metas)
        bbox_pts = self.simple_test_pts(pts_feats, img_feats, img_metas, rescale=rescale)
        return [dict(pts_bbox=result) for result in bbox_pts]

    def aug_test(self, points, img_metas, imgs=None, rescale=False):
        """CMT has no test-time augmentation merge."""
        raise NotImplementedError(f'CmtDetector does not support test-time augmentation ({len(img_metas)} '
                                  f'augmentations given); set flip=False and one scale in MultiScaleFlipAug3D')
