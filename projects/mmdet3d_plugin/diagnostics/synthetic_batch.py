"""Synthetic multi-modal batches with no dataset: LiDAR points around random boxes, six ring cameras, their metas.

Used by ``tools/check_gpu.py`` (training the demo model) and
``tools/benchmark_model.py`` (timing real configs on fixed inputs)::

    batch = random_demo_batch(cfg, num_boxes=(30, ), device='cpu', generator=torch.Generator().manual_seed(0))
    losses = model(return_loss=True, **batch)
    results = model.simple_test(batch['points'], batch['img_metas'], batch['img'])
"""
from typing import Sequence

import numpy as np
import torch

#: camera views of the synthetic rig (nuScenes has six)
NUM_VIEWS = 6


def ring_camera(yaw: float, img_w: int, img_h: int) -> np.ndarray:
    """``lidar2img [4, 4]`` of a camera at the LiDAR origin looking along ``yaw`` (90 deg horizontal FOV)."""
    forward, right, down = [np.cos(yaw), np.sin(yaw), 0.0], [np.sin(yaw), -np.cos(yaw), 0.0], [0.0, 0.0, -1.0]
    lidar2cam, intrinsic = np.eye(4), np.eye(4)
    lidar2cam[:3, :3] = [right, down, forward]
    intrinsic[:3, :3] = [[img_w / 2, 0.0, img_w / 2], [0.0, img_w / 2, img_h / 2], [0.0, 0.0, 1.0]]
    return intrinsic @ lidar2cam


def random_demo_batch(cfg, num_boxes: Sequence[int], device: str, generator: torch.Generator,
                      points_per_box: int = 200) -> dict:
    """A training batch: LiDAR points around random boxes, six cameras, their metas.

    Args:
        cfg (mmcv.Config): a CMT config: ``point_cloud_range``, ``class_names``
            and the image size ``ida_aug_conf['final_dim']`` (H, W).
        num_boxes (Sequence[int]): ground-truth boxes per sample (DN queries scale with the largest).
        device (str): where the tensors go.
        generator (torch.Generator): the randomness (a fixed seed gives the same batch).
        points_per_box (int): LiDAR points drawn around each box centre
            (Gaussian, 0.5 m); those outside the range are dropped.

    Returns:
        dict: ``points`` (per sample ``[P_i, 5]``), ``img`` ``[bs, 6, 3, H, W]``,
        ``img_metas`` (``lidar2img`` of the 6 views, ``img_shape``, ``pad_shape``,
        ``box_type_3d``), ``gt_bboxes_3d`` (``LiDARInstance3DBoxes``, 9 values),
        ``gt_labels_3d`` (per sample ``[n_i]``).
    """
    from mmdet3d.core.bbox import LiDARInstance3DBoxes

    x_min, y_min, z_min, x_max, y_max, z_max = cfg.point_cloud_range
    img_h, img_w = cfg.ida_aug_conf['final_dim']
    cameras = [ring_camera(view * np.pi / 3, img_w, img_h) for view in range(NUM_VIEWS)]  # 60 deg apart
    data = dict(img_metas=[], gt_bboxes_3d=[], gt_labels_3d=[], points=[])
    for count in num_boxes:
        boxes = torch.zeros(count, 9)
        boxes[:, :2] = (torch.rand(count, 2, generator=generator) - 0.5) * 0.8 * (x_max - x_min)
        boxes[:, 2] = -1.5
        boxes[:, 3:6] = torch.rand(count, 3, generator=generator) * 3 + 1
        boxes[:, 6] = (torch.rand(count, generator=generator) - 0.5) * 2 * torch.pi
        centres = boxes[:, None, :3] + torch.randn(count, points_per_box, 3, generator=generator) * 0.5
        points = torch.cat([centres.reshape(-1, 3), torch.rand(count * points_per_box, 2, generator=generator)], 1)
        inside = ((points[:, 0] > x_min) & (points[:, 0] < x_max) & (points[:, 1] > y_min) & (points[:, 1] < y_max)
                  & (points[:, 2] > z_min) & (points[:, 2] < z_max))
        data['points'].append(points[inside].to(device))
        data['gt_bboxes_3d'].append(LiDARInstance3DBoxes(boxes, box_dim=9).to(device))
        data['gt_labels_3d'].append(torch.randint(0, len(cfg.class_names), (count, ), generator=generator).to(device))
        data['img_metas'].append(dict(box_type_3d=LiDARInstance3DBoxes, lidar2img=cameras,
                                      img_shape=[(img_h, img_w, 3)] * NUM_VIEWS,
                                      pad_shape=[(img_h, img_w, 3)] * NUM_VIEWS))
    data['img'] = torch.randn(len(num_boxes), NUM_VIEWS, 3, img_h, img_w, generator=generator).to(device)
    return data
