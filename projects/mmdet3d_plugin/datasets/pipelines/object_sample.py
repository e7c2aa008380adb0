"""Multi-modal GT copy-paste: LiDAR points of database objects and, optionally, their camera image patches."""
import copy
from typing import Dict, List, Optional, Sequence

import cv2
import numpy as np
from mmdet.datasets.builder import PIPELINES
from mmdet3d.datasets.builder import OBJECTSAMPLERS
from mmcv.utils import build_from_cfg

from ..box_geometry import box_corners, points_in_boxes
from ..camera_geometry import box_image_rects


def paste_patches(image: np.ndarray, lidar2img: np.ndarray, corners: np.ndarray, num_scene_boxes: int,
                  patches: Sequence[Optional[np.ndarray]], mixup_rate: float) -> np.ndarray:
    """Paste the image patches of sampled objects into one view, far objects first.

    Every box (the scene's own first, then the sampled ones) is projected with
    ``lidar2img``; boxes entirely in front of the camera are painted in order
    of decreasing depth: a sampled box gets its patch resized to its
    projected rectangle, a scene box gets its own original pixels back, so a
    nearer real object still hides a farther pasted one.

    Args:
        image: ``[H, W, C]`` the view.
        lidar2img: ``[4, 4]`` its projection.
        corners: ``[M, 8, 3]`` corners of all boxes, the scene's first.
        num_scene_boxes: how many of the boxes are the scene's own.
        patches: per sampled box (``M - num_scene_boxes`` entries) its patch
            ``[h, w, C]`` for this view, or None to paste nothing.
        mixup_rate: ``< 0`` replaces the pixels; otherwise the pasted pixels
            are ``(1 - mixup_rate) * current + mixup_rate * patch``.

    Returns:
        np.ndarray: the new view, same shape and dtype as ``image``.
    """
    if len(patches) != len(corners) - num_scene_boxes:
        raise ValueError(f'{len(patches)} patches for {len(corners) - num_scene_boxes} sampled boxes')
    rects, depth, visible = box_image_rects(corners, lidar2img, image.shape[:2])
    original = image.astype(np.float32)
    canvas = original.copy()
    for box in sorted(np.nonzero(visible)[0], key=lambda i: -depth[i]):
        x1, y1, x2, y2 = rects[box]
        if box < num_scene_boxes:
            patch = original[y1:y2, x1:x2]
        else:
            patch = patches[box - num_scene_boxes]
            if patch is None:
                continue
            patch = cv2.resize(patch, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR).astype(np.float32)
            patch = patch.reshape(y2 - y1, x2 - x1, -1)
        if mixup_rate < 0:
            canvas[y1:y2, x1:x2] = patch
        else:
            canvas[y1:y2, x1:x2] = (1 - mixup_rate) * canvas[y1:y2, x1:x2] + mixup_rate * patch
    if np.issubdtype(image.dtype, np.integer):
        info = np.iinfo(image.dtype)
        canvas = np.clip(np.round(canvas), info.min, info.max)
    return canvas.astype(image.dtype).reshape(image.shape)


@PIPELINES.register_module()
class UnifiedObjectSample:
    """Copy-paste GT-database objects into the scene, in the point cloud and (``sample_2d``) in the images.

    The sampled objects keep the LiDAR-frame pose they had in their source
    frame. Points of the scene inside a sampled box are removed and the
    object's points added; its boxes and labels are appended to
    ``gt_bboxes_3d`` / ``gt_labels_3d``. With ``sample_2d`` every view gets
    the object's patch (the patch of the same camera when the database has
    one, else its largest patch) pasted where its box projects under the
    current ``lidar2img`` (see :func:`paste_patches`), so the images and
    the points agree. Run it before the geometric augmentations.

    Args:
        db_sampler (dict): config of the sampler, by default
            ``UnifiedDataBaseSampler`` (in mmdet3d's ``OBJECTSAMPLERS``).
        sample_2d (bool): also paste image patches (needs ``img`` and
            ``lidar2img`` in ``results``).
        mixup_rate (float): ``< 0`` pastes opaque patches; otherwise the weight
            of the patch in a blend with the image (upstream CMT uses 0.5).
    """

    def __init__(self, db_sampler: Dict, sample_2d: bool = False, mixup_rate: float = -1) -> None:
        if mixup_rate > 1:
            raise ValueError(f'UnifiedObjectSample: mixup_rate must be <= 1 (negative = opaque), got {mixup_rate}')
        sampler_cfg = copy.deepcopy(dict(db_sampler))
        sampler_cfg.setdefault('type', 'UnifiedDataBaseSampler')
        self.db_sampler = build_from_cfg(sampler_cfg, OBJECTSAMPLERS)
        self.sample_2d = sample_2d
        self.mixup_rate = mixup_rate

    def __call__(self, results: Dict) -> Dict:
        missing = [key for key in ('gt_bboxes_3d', 'gt_labels_3d', 'points') if key not in results]
        if self.sample_2d:
            missing += [key for key in ('img', 'lidar2img') if key not in results]
        if missing:
            raise KeyError(f'UnifiedObjectSample needs {missing} in results (load points, images and annotations '
                           f'first)')
        gt_boxes = results['gt_bboxes_3d']
        gt_labels = np.asarray(results['gt_labels_3d'])
        sampled = self.db_sampler.sample_all(gt_boxes.tensor.numpy(), gt_labels, with_img=self.sample_2d)
        if sampled is None:
            return results
        num_scene_boxes = len(gt_boxes)
        gt_boxes = gt_boxes.new_box(np.concatenate([gt_boxes.tensor.numpy(), sampled['gt_bboxes_3d']]))
        results['gt_bboxes_3d'] = gt_boxes
        results['gt_labels_3d'] = np.concatenate([gt_labels, sampled['gt_labels_3d']]).astype(np.int64)

        points = results['points']
        if points.points_dim != sampled['points'].points_dim:
            raise ValueError(f'UnifiedObjectSample: scene points have {points.points_dim} values per point, the '
                             f'database points {sampled["points"].points_dim} (match the points_loader use_dim)')
        inside = points_in_boxes(points.coord.numpy(), sampled['gt_bboxes_3d']).any(axis=1)
        results['points'] = points.cat([points[np.nonzero(~inside)[0]], sampled['points']])

        if self.sample_2d:
            corners = box_corners(gt_boxes.tensor.numpy())
            camera_names = results.get('camera_names', [None] * len(results['img']))
            images: List[np.ndarray] = []
            for view, (image, lidar2img) in enumerate(zip(results['img'], results['lidar2img'])):
                patches = [object_patches.get(camera_names[view], object_patches.get(None))
                           for object_patches in sampled['images']]
                images.append(paste_patches(image, lidar2img, corners, num_scene_boxes, patches, self.mixup_rate))
            results['img'] = images
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(db_sampler={self.db_sampler}, sample_2d={self.sample_2d}, '
                f'mixup_rate={self.mixup_rate})')
