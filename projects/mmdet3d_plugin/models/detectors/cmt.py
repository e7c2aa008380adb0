"""``CmtDetector``: the Cross Modal Transformer detector (Yan et al., ICCV 2023).

An mmdet3d ``MVXTwoStageDetector`` whose LiDAR branch (spconv-2
voxelization -> ``HardSimpleVFE`` -> ``SparseEncoder`` -> ``SECOND`` ->
``SECONDFPN``) and camera branch (backbone -> ``CPFPN``) both feed one
query-based head (``CmtHead`` and its LiDAR-only / camera-only variants).
Either branch may be absent from the config (LiDAR-only, camera-only).

Bad LiDAR input is handled per sample: points with NaN/inf values are
dropped (with a one-time warning); a sample without any point inside
``point_cloud_range`` (e.g. the ``lidar_drop`` corruption) has no voxel, and
the sparse encoder's output for it is an all-zero BEV map, as spconv gives
for a sample without voxels, also when no sample of the batch has one. A
training batch with a single voxel is normalised with the encoders' running
BatchNorm statistics (see ``_single_voxel_batch_norm``). Camera images must
come with one ``lidar2img`` matrix each.
"""
import warnings
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmcv.runner import auto_fp16, force_fp32
from mmdet.models.builder import DETECTORS
from mmdet3d.core import bbox3d2result
from mmdet3d.models.detectors.mvx_two_stage import MVXTwoStageDetector
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...attention import pop_inexact_rows
from ...config_upgrade import upgrade_model_config
from ...mmcv_custom.device_log import parse_losses_on_device, read_scalars
from ...utils.host_data import host_to_device, permitted_host_sync
from ..aqr.routing_targets import count_points_in_boxes
from ..utils.camera_blanking import FusedBlankViews, black_camera_images, blank_camera_views
from ..utils.grid_mask import GridMask
from ..utils.img_meta_keys import BLANK_VIEWS_KEY, LIDAR_POINTS_KEY
from ..utils.spconv_voxelize import SPConvVoxelization
from ..utils.zero_through_parameters import zero_through_parameters


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
            ``train_cfg``, ``test_cfg``, ``init_cfg``, ...), first through
            :func:`~projects.mmdet3d_plugin.config_upgrade.upgrade_model_config`
            (legacy keys rewritten with a log line, or refused naming the key
            to use), so a model built from Python takes the same configs as
            the tools.
    """

    def __init__(self, use_grid_mask: bool = False, pts_voxel_layer: Optional[dict] = None, **kwargs) -> None:
        kwargs = upgrade_model_config(dict(kwargs, type=type(self).__name__))
        kwargs.pop('type')
        super().__init__(pts_voxel_layer=None, **kwargs)
        self.use_grid_mask = use_grid_mask
        if use_grid_mask:
            self.grid_mask = GridMask(True, True, rotate=1, offset=False, ratio=0.5, mode=1, prob=0.7)
        if pts_voxel_layer:
            self.pts_voxel_layer = SPConvVoxelization(**pts_voxel_layer)
        self._warned = set()

    #: return the training log variables as device tensors (``mmcv_custom.device_log``): ``train_detector`` sets it
    #: with the runner's ``DeviceLogBuffer``; off, they are read with ``.item()`` as mmdet's loops expect
    keep_log_vars_on_device = False

    def _parse_losses(self, losses: Dict[str, Tensor]) -> Tuple[Tensor, Dict[str, object]]:
        """The total loss and the log variables: detached 0-dim device tensors with ``keep_log_vars_on_device``
        (no host synchronisation), numbers otherwise."""
        loss, log_vars = parse_losses_on_device(losses)
        if not self.keep_log_vars_on_device:
            log_vars = read_scalars(log_vars)
        return loss, log_vars

    def _warn_once(self, key: str, message: str) -> None:
        """``warnings.warn(message)`` the first time ``key`` comes up for this detector."""
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f'{type(self).__name__}: {message}', stacklevel=2)

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
        if img.dim() not in (4, 5):
            raise ValueError(f'img must be [bs, N, C, H, W] or [bs * N, C, H, W], got {tuple(img.shape)}')
        self._check_camera_count(img, img_metas)
        if img.dim() == 5:
            img = img.flatten(0, 1)
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

    @staticmethod
    def _check_camera_count(img: Tensor, img_metas: Sequence[dict]) -> None:
        """``ValueError`` unless every sample has as many ``lidar2img`` matrices as camera images."""
        if img.dim() == 5:
            if img.size(0) != len(img_metas):
                raise ValueError(f'img holds {img.size(0)} samples but there are {len(img_metas)} img_metas')
            images_per_sample = img.size(1)
        else:
            images_per_sample = img.size(0) / max(len(img_metas), 1)
        for index, meta in enumerate(img_metas):
            if 'lidar2img' in meta and len(meta['lidar2img']) != images_per_sample:
                raise ValueError(f'img has {images_per_sample:g} camera images per sample ({tuple(img.shape)}) but '
                                 f"img_metas[{index}]['lidar2img'] has {len(meta['lidar2img'])} matrices: every "
                                 f'camera image needs its lidar2img')

    @force_fp32(apply_to=('points', 'img_feats'))
    def extract_pts_feat(self, points: Optional[Sequence[Tensor]], img_feats: Optional[List[Tensor]],
                         img_metas: Sequence[dict]) -> Optional[List[Tensor]]:
        """BEV features ``[bs, C, H, W]`` (a list with the neck's levels), or None without LiDAR.

        A sample without points (or without any inside ``point_cloud_range``)
        gets the features of an all-zero sparse encoder output.
        """
        if points is None or not self.with_pts_bbox or not hasattr(self, 'pts_voxel_encoder'):
            return None
        with permitted_host_sync():  # the number of points and voxels of a sample is data
            points = self.drop_non_finite_points(points)
            voxels, num_points, coors = self.voxelize(points)
            x = self.encode_voxels(voxels, num_points, coors, len(points))
        x = self.pts_backbone(x)
        if self.with_pts_neck:
            x = self.pts_neck(x)
        return list(x)

    def drop_non_finite_points(self, points: Sequence[Tensor]) -> List[Tensor]:
        """Per sample ``[P_i', F]``: the points without NaN/inf values (a one-time warning says how many went)."""
        kept, dropped = [], []
        for sample_points in points:
            finite = torch.isfinite(sample_points).all(dim=1)
            dropped.append(int(finite.numel() - finite.sum()))
            kept.append(sample_points if dropped[-1] == 0 else sample_points[finite])
        if any(dropped):
            self._warn_once('non_finite_points', f'dropped {sum(dropped)} LiDAR points with NaN/inf values '
                            f'(per sample: {dropped}); later drops are not reported')
        return kept

    def encode_voxels(self, voxels: Tensor, num_points: Tensor, coors: Tensor, batch_size: int) -> Tensor:
        """The voxel and sparse encoders: voxels of the batch -> BEV map ``[bs, C, H, W]``.

        Args:
            voxels (Tensor): ``[M, max_points, F]``; ``M`` may be 0.
            num_points (Tensor): ``[M]`` points per voxel.
            coors (Tensor): ``[M, 4]`` ``(sample, z, y, x)``.
            batch_size (int): samples of the batch.

        Returns:
            Tensor: ``[bs, C * D, H, W]``; zero for the samples without voxels.
        """
        if len(voxels) == 0:  # spconv cannot run on an empty input; its output would be all zeros
            channels, height, width = middle_encoder_bev_shape(self.pts_middle_encoder)
            empty = voxels.new_zeros(batch_size, channels, height, width)
            if self.training and torch.is_grad_enabled():  # zero gradients for DDP, which waits for every one
                empty = empty + zero_through_parameters(self.pts_voxel_encoder, self.pts_middle_encoder)
            return empty
        with self._single_voxel_batch_norm(len(voxels)):
            voxel_features = self.pts_voxel_encoder(voxels, num_points, coors)
            return self.pts_middle_encoder(voxel_features, coors, batch_size)

    @contextmanager
    def _single_voxel_batch_norm(self, num_voxels: int) -> Iterator[None]:
        """Let the LiDAR encoders' BatchNorm layers use their running statistics when there is one voxel.

        In training, BatchNorm normalises with the batch's statistics, which
        one value per channel cannot give (torch raises). A batch whose only
        voxel is, e.g., the origin of a LiDAR sweep zeroed by ``ModalMask3D``
        with ``samples_per_gpu=1`` is normalised with the running statistics
        instead (as in testing), which are left unchanged; gradients still
        reach every layer. ``SyncBatchNorm`` layers are left alone: they
        gather the statistics of all processes.
        """
        batch_norms = []
        if self.training and num_voxels == 1:
            encoders = (self.pts_voxel_encoder, self.pts_middle_encoder)
            batch_norms = [module for encoder in encoders for module in encoder.modules()
                           if isinstance(module, _BatchNorm) and module.training
                           and not isinstance(module, nn.SyncBatchNorm)]
        if batch_norms:
            self._warn_once('single_voxel', 'a training batch has a single non-empty voxel (its LiDAR input was '
                            'dropped?): the LiDAR encoders\' BatchNorm layers use their running statistics for such '
                            'batches (one value per channel has no batch statistics)')
        for module in batch_norms:
            module.train(False)
        try:
            yield
        finally:
            for module in batch_norms:
                module.train(True)

    @torch.no_grad()
    @force_fp32()
    def voxelize(self, points: Sequence[Tensor]):
        """Voxelize every sample.

        Args:
            points (Sequence[Tensor]): per sample ``[P_i, num_point_features]``.

        Returns:
            tuple[Tensor, Tensor, Tensor]: voxels ``[M, max_points, F]``, points
            per voxel ``[M]``, coordinates ``[M, 4]`` ``(sample, z, y, x)``;
            ``M`` is 0 when no point lies inside ``point_cloud_range``.
        """
        if not hasattr(self, 'pts_voxel_layer'):
            raise RuntimeError('CmtDetector has LiDAR encoders but no pts_voxel_layer in its config')
        voxels, coors, num_points = [], [], []
        for sample, sample_points in enumerate(points):
            sample_voxels, sample_coors, sample_num = self.pts_voxel_layer(sample_points)
            voxels.append(sample_voxels)
            coors.append(F.pad(sample_coors, (1, 0), mode='constant', value=sample))
            num_points.append(sample_num)
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
        img_feats, pts_feats, fused_blank_views = self.extract_train_feat(points, img, img_metas)
        gt_num_points = None
        if getattr(self.pts_bbox_head, 'needs_gt_point_counts', False):
            if points is None:
                raise ValueError(f'{type(self.pts_bbox_head).__name__} needs the LiDAR points to count those in each '
                                 f'ground-truth box (AQR query_loss_weight > 0)')
            gt_num_points = [count_points_in_boxes(sample_points, boxes.tensor.to(sample_points.device))
                             for sample_points, boxes in zip(points, gt_bboxes_3d)]
        if getattr(self.pts_bbox_head, 'needs_points_in_train_metas', False):
            img_metas = [dict(meta, **{LIDAR_POINTS_KEY: sample_points[:, :3]})
                         for meta, sample_points in zip(img_metas, points)]
        return self.forward_pts_train(pts_feats, img_feats, gt_bboxes_3d, gt_labels_3d, img_metas, gt_num_points,
                                      fused_blank_views)

    def extract_train_feat(self, points: Optional[Sequence[Tensor]], img: Optional[Tensor], img_metas: Sequence[dict]
                           ) -> Tuple[Optional[List[Tensor]], Optional[List[Tensor]], Optional[FusedBlankViews]]:
        """``extract_feat``, and for the samples the head draws (``fused_image_drop_prob``) the features of black
        camera views, computed in the same image-backbone batch as the real ones.

        Returns:
            tuple: camera features (levels ``[bs * N, C, h, w]``), BEV
            features and :class:`FusedBlankViews` (None when no sample is drawn).
        """
        drawn = (False, )
        if img is not None and getattr(self.pts_bbox_head, 'fused_image_drop_prob', 0) > 0:
            drawn = self.pts_bbox_head.draw_fused_image_drops(img_metas)
        if not any(drawn):
            return (*self.extract_feat(points, img=img, img_metas=img_metas), None)
        if img.dim() != 5:
            raise ValueError(f'fused_image_drop_prob needs img as [bs, N, C, H, W], got {tuple(img.shape)}')
        indices = [index for index, flag in enumerate(drawn) if flag]
        drawn_metas = [img_metas[index] for index in indices]
        black = black_camera_images(img.index_select(0, host_to_device(indices, img.device, torch.long)), drawn_metas)
        feats = self.extract_img_feat(torch.cat((img, black)), list(img_metas) + drawn_metas)
        num_real = img.size(0) * img.size(1)
        img_feats = [level[:num_real] for level in feats]
        pts_feats = self.extract_pts_feat(points, img_feats, img_metas)
        return img_feats, pts_feats, FusedBlankViews(drawn, feats[0][num_real:])

    @force_fp32(apply_to=('pts_feats', 'img_feats'))
    def forward_pts_train(self, pts_feats: Optional[List[Tensor]], img_feats: Optional[List[Tensor]],
                          gt_bboxes_3d: Sequence, gt_labels_3d: Sequence[Tensor], img_metas: Sequence[dict],
                          gt_num_points: Optional[List[Tensor]] = None,
                          fused_blank_views: Optional[FusedBlankViews] = None) -> Dict[str, Tensor]:
        """Head forward (with denoising queries) and losses.

        ``gt_num_points`` (per sample ``[n]``, the LiDAR points in each box) is
        passed to the head's ``loss`` when given (``needs_gt_point_counts``);
        ``fused_blank_views`` to its forward when given (``fused_image_drop_prob``).
        """
        extra_inputs = {} if fused_blank_views is None else dict(fused_blank_views=fused_blank_views)
        outs = self.pts_bbox_head(pts_feats or [None], img_feats or [None], img_metas, gt_bboxes_3d, gt_labels_3d,
                                  **extra_inputs)
        extra = {} if gt_num_points is None else dict(gt_num_points=gt_num_points)
        with permitted_host_sync():  # the Hungarian matching runs on the host; the boxes are split per task
            losses = self.pts_bbox_head.loss(gt_bboxes_3d, gt_labels_3d, outs, **extra)
        inexact = pop_inexact_rows()
        if inexact is not None:  # rows segment attention left inexact off the CPU (read when the log is)
            losses['segment_inexact_rows'] = inexact.float()
        return losses

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
        if getattr(self.pts_bbox_head, 'needs_points_in_metas', False):
            if points is None:
                raise ValueError(f'{type(self.pts_bbox_head).__name__} reads each sample\'s LiDAR points at test time '
                                 f'(oracle routing, lidar_free_pass), but no points were given')
            img_metas = [dict(meta, **{LIDAR_POINTS_KEY: sample_points[:, :3]})
                         for meta, sample_points in zip(img_metas, points)]
        if getattr(self.pts_bbox_head, 'needs_blank_views_in_metas', False):
            if img is None:
                raise ValueError(f'{type(self.pts_bbox_head).__name__} reads at test time which camera images are '
                                 f'blank (camera_free_pass), but no images were given')
            with permitted_host_sync():  # which pass decodes a sample is data: one read per batch
                blank_views = blank_camera_views(img, img_metas).tolist()
            img_metas = [dict(meta, **{BLANK_VIEWS_KEY: blank}) for meta, blank in zip(img_metas, blank_views)]
        bbox_pts = self.simple_test_pts(pts_feats, img_feats, img_metas, rescale=rescale)
        return [dict(pts_bbox=result) for result in bbox_pts]

    def aug_test(self, points, img_metas, imgs=None, rescale=False):
        """CMT has no test-time augmentation merge."""
        raise NotImplementedError(f'CmtDetector does not support test-time augmentation ({len(img_metas)} '
                                  f'augmentations given); set flip=False and one scale in MultiScaleFlipAug3D')


def middle_encoder_bev_shape(encoder: nn.Module) -> Tuple[int, int, int]:
    """``(C, H, W)`` of the BEV map the LiDAR middle encoder outputs, without running it.

    mmdet3d's ``PointPillarsScatter`` (pillars) scatters ``in_channels``
    features onto its ``output_shape`` grid; a spconv encoder is followed
    through its convolutions (:func:`sparse_encoder_bev_shape`).
    """
    if hasattr(encoder, 'output_shape') and hasattr(encoder, 'in_channels') and not hasattr(encoder, 'sparse_shape'):
        height, width = encoder.output_shape
        return encoder.in_channels, height, width
    return sparse_encoder_bev_shape(encoder)


def sparse_encoder_bev_shape(encoder: nn.Module) -> Tuple[int, int, int]:
    """``(C * D, H, W)`` of the BEV map a sequential spconv encoder (mmdet3d's ``SparseEncoder``) outputs.

    Follows the encoder's input grid ``sparse_shape`` ``[D, H, W]`` through
    its sparse convolutions in order (submanifold ones keep the grid); ``C``
    is the last one's output channels, and ``D`` is folded into the channels
    as ``SparseEncoder.forward`` does.
    """
    from spconv.pytorch.conv import SparseConvolution
    from spconv.pytorch.ops import get_conv_output_size
    if not hasattr(encoder, 'sparse_shape'):
        raise TypeError(f'{type(encoder).__name__} has no sparse_shape: cannot tell the shape of its output')
    shape, channels = list(encoder.sparse_shape), None
    for module in encoder.modules():
        if not isinstance(module, SparseConvolution):
            continue
        if module.transposed or module.inverse:
            raise TypeError(f'{type(encoder).__name__} has a transposed or inverse sparse convolution: cannot tell '
                            f'the shape of its output')
        if not module.subm:
            shape = get_conv_output_size(shape, module.kernel_size, module.stride, module.padding, module.dilation)
        channels = module.out_channels
    if channels is None or len(shape) != 3:
        raise TypeError(f'{type(encoder).__name__} is not a 3D sparse convolution encoder')
    depth, height, width = shape
    return channels * depth, height, width
