"""Small CMT models and random multi-view + point-cloud batches for the model tests.

``reduced_cmt_config(name)`` loads ``configs/<name>.py`` and shrinks what only
costs time: a 24 m x 24 m point-cloud range (same voxel sizes, so a 40 x 40 or
30 x 30 BEV map), 40 queries, fewer voxels. Architecture, widths and the six
decoder layers stay as configured. ``random_batch`` makes a batch with two
camera views of 32 x 96 pixels whose ``lidar2img`` are real projections
(a front and a back camera), random boxes with velocity and LiDAR points
clustered around them.
"""
import math
import os

import numpy as np
import pytest
import torch
from mmcv import Config
from mmdet3d.core.bbox import LiDARInstance3DBoxes

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_RANGE = [-12.0, -12.0, -5.0, 12.0, 12.0, 3.0]
IMG_H, IMG_W, NUM_VIEWS = 32, 96, 2
NUM_QUERY = 40
# Outputs recorded under tests/data/reference are compared to this fraction of each tensor's largest value:
# float32 rounding differs between CPUs (MKL and oneDNN pick their kernels by the processor; measured up to
# 1.03e-6 between an AMD EPYC and the recording machine), so bit-for-bit holds only where a reference was written.
REFERENCE_RTOL = 1e-5


def reduced_cmt_config(name: str, weight_head_std: float = 0.01) -> Config:
    """configs/<name>.py with a small point-cloud range and few queries (see the module docstring); in an AQR
    config, the router's weight head starts with weights of ``weight_head_std`` (0.01: every query its own weights,
    so that the tests see the routing at work; 0, the configs' own: every query exactly at its ``init_weight``)."""
    cfg = Config.fromfile(os.path.join(REPO_ROOT, 'configs', f'{name}.py'))
    model = cfg.model
    head = model.pts_bbox_head
    if head.get('aqr_config'):
        head.aqr_config.weight_head_std = weight_head_std
    head.num_query = NUM_QUERY
    head.bbox_coder.pc_range = SMALL_RANGE
    voxel_size = head.bbox_coder.voxel_size
    grid = int(round((SMALL_RANGE[3] - SMALL_RANGE[0]) / voxel_size[0]))
    if model.get('pts_voxel_layer'):
        model.pts_voxel_layer.point_cloud_range = SMALL_RANGE
        model.pts_voxel_layer.max_voxels = (4000, 4000)
        model.pts_middle_encoder.sparse_shape = [41, grid, grid]
    for mode_cfg in (model.train_cfg.pts, model.test_cfg.pts):
        mode_cfg.grid_size = [grid, grid, 40]
    model.train_cfg.pts.point_cloud_range = SMALL_RANGE
    model.train_cfg.pts.assigner.pc_range = SMALL_RANGE
    return cfg


def _camera(yaw: float) -> np.ndarray:
    """lidar2img of a camera at the origin looking along LiDAR direction ``yaw`` (focal 40 px)."""
    cos, sin = math.cos(yaw), math.sin(yaw)
    # camera axes in LiDAR coordinates: x right, y down, z forward
    forward = np.array([cos, sin, 0.0])
    right = np.array([sin, -cos, 0.0])
    down = np.array([0.0, 0.0, -1.0])
    lidar2cam = np.eye(4)
    lidar2cam[:3, :3] = np.stack([right, down, forward])
    intrinsic = np.eye(4)
    intrinsic[:3, :3] = [[40.0, 0.0, IMG_W / 2], [0.0, 40.0, IMG_H / 2], [0.0, 0.0, 1.0]]
    return intrinsic @ lidar2cam


def make_img_metas(batch_size: int, with_camera: bool = True):
    """Per sample meta dicts as the pipeline's Collect3D writes them."""
    metas = []
    for _ in range(batch_size):
        meta = dict(box_type_3d=LiDARInstance3DBoxes, sample_idx='random')
        if with_camera:
            meta.update(lidar2img=[_camera(0.0), _camera(math.pi)][:NUM_VIEWS],
                        img_shape=[(IMG_H, IMG_W, 3)] * NUM_VIEWS, pad_shape=[(IMG_H, IMG_W, 3)] * NUM_VIEWS)
        metas.append(meta)
    return metas


def random_boxes(num: int) -> LiDARInstance3DBoxes:
    """``num`` boxes (bottom centre, sizes 1..4 m, yaw, velocity) inside the small range."""
    tensor = torch.zeros(num, 9)
    tensor[:, :2] = torch.rand(num, 2) * 16 - 8
    tensor[:, 2] = -1.5
    tensor[:, 3:6] = torch.rand(num, 3) * 3 + 1
    tensor[:, 6] = torch.rand(num) * 6 - 3
    tensor[:, 7:9] = torch.randn(num, 2)
    return LiDARInstance3DBoxes(tensor, box_dim=9)


def random_points(boxes: LiDARInstance3DBoxes, points_per_cluster: int = 150) -> torch.Tensor:
    """``[P, 5]`` points in clusters around the box centres (around the origin without boxes).

    Clustered like real LiDAR returns: uniformly scattered points would each
    dilate into many voxels in the strided sparse convolutions, whose CPU
    backward pass is slow.
    """
    centres = boxes.gravity_center if len(boxes) else torch.zeros(1, 3)
    xyz = (centres[:, None] + torch.randn(len(centres), points_per_cluster, 3) * 0.3).reshape(-1, 3)
    low, high = torch.tensor(SMALL_RANGE[:3]) + 0.01, torch.tensor(SMALL_RANGE[3:]) - 0.01
    xyz = torch.max(torch.min(xyz, high), low)
    return torch.cat([xyz, torch.rand(len(xyz), 2)], dim=1)


def random_batch(num_boxes=(3, 2), with_lidar=True, with_camera=True):
    """Training inputs of ``len(num_boxes)`` samples: ``points``, ``img``, ``img_metas``, ``gt_bboxes_3d``, ``gt_labels_3d``."""
    batch_size = len(num_boxes)
    data = dict(img_metas=make_img_metas(batch_size, with_camera),
                gt_bboxes_3d=[random_boxes(n) for n in num_boxes],
                gt_labels_3d=[torch.randint(0, 10, (n, )) for n in num_boxes])
    if with_lidar:
        data['points'] = [random_points(boxes) for boxes in data['gt_bboxes_3d']]
    if with_camera:
        data['img'] = torch.randn(batch_size, NUM_VIEWS, 3, IMG_H, IMG_W)
    return data


def train_step(model, data: dict) -> dict:
    """One training forward (``model.train_step``) and backward from a clean gradient; returns its outputs."""
    model.train()
    model.zero_grad()
    outputs = model.train_step(data, optimizer=None)
    outputs['loss'].backward()
    return outputs


def differs_from_reference(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether ``actual`` differs from the recorded ``expected``: another shape, a NaN or infinity where the
    reference has none (or another one), or a finite value off by more than ``REFERENCE_RTOL`` of ``expected``'s
    largest finite magnitude. Pass one field at a time (a box code mixes metres and logits: one scale would hide
    an error in the smaller field)."""
    if actual.shape != expected.shape:
        return True
    actual, expected = actual.detach().double(), expected.detach().double()
    finite = torch.isfinite(expected)
    if not torch.equal(torch.isfinite(actual), finite) or not torch.equal(actual.isnan(), expected.isnan()) \
            or not torch.equal(actual[expected.isinf()], expected[expected.isinf()]):
        return True
    if not finite.any():
        return False
    scale = float(expected[finite].abs().max().clamp(min=1e-12))
    return float((actual[finite] - expected[finite]).abs().max()) > REFERENCE_RTOL * scale


@pytest.fixture(scope='session')
def cmt_test_data():
    """The helpers of this module, for test files that cannot import it by name."""
    return dict(reduced_config=reduced_cmt_config, random_batch=random_batch, random_boxes=random_boxes,
                make_img_metas=make_img_metas, train_step=train_step, small_range=SMALL_RANGE, num_query=NUM_QUERY,
                differs_from_reference=differs_from_reference,
                image_size=(IMG_H, IMG_W), num_views=NUM_VIEWS)
