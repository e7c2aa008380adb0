"""GT database for ``UnifiedObjectSample``: each training object's LiDAR points and camera image patches.

Written under ``out_dir``::

    <prefix>_gt_database/pts_dir/<sample token>_<class>_<index>.bin
        float32 [P, 5] (x, y, z, intensity, time lag): the key frame and its
        sweeps, like the training pipeline loads them, relative to the bottom
        centre of the box
    <prefix>_gt_database/img_dir/<sample token>_<class>_<index>_<camera>.png
        the pixels the box covers in every camera that sees it (all corners in
        front of the camera, at least ``min_patch_size`` pixels wide and high)
    <prefix>_dbinfos_train.pkl
        dict class name -> list of object records (the layout is documented in
        ``projects/mmdet3d_plugin/datasets/pipelines/dbsampler.py``); paths are
        relative to ``out_dir``

Boxes are mmdet3d ``LiDARInstance3DBoxes`` rows with velocity (9 values,
bottom centre) as ``NuScenesDataset.get_ann_info`` produces them; only the
valid boxes (``valid_flag``) of the given classes are stored.
"""
import os
import os.path as osp
import pickle
from typing import Dict, List, Optional, Sequence

import cv2
import numpy as np

from projects.mmdet3d_plugin.datasets.box_geometry import points_in_boxes
from projects.mmdet3d_plugin.datasets.camera_geometry import (box_image_rects, compose_lidar2img,
                                                               lidar2cam_from_sensor2lidar, pad_intrinsic)
from .nuscenes_converter import load_infos, report_progress, require_file

POINT_DIMS = 5


def _points_loaders(max_sweeps: int):
    """mmdet3d's key-frame + sweep loaders, configured as in the CMT training pipeline."""
    from mmcv.utils import build_from_cfg
    from mmdet3d.datasets.builder import PIPELINES
    key_frame = build_from_cfg(dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=POINT_DIMS,
                                    use_dim=list(range(POINT_DIMS))), PIPELINES)
    sweeps = build_from_cfg(dict(type='LoadPointsFromMultiSweeps', sweeps_num=max_sweeps, load_dim=POINT_DIMS,
                                 use_dim=list(range(POINT_DIMS)), pad_empty_sweeps=True, remove_close=True,
                                 test_mode=True), PIPELINES)
    return key_frame, sweeps


def info_boxes(info: dict, classes: Sequence[str]):
    """Valid boxes of ``classes`` in one info as ``LiDARInstance3DBoxes`` (9 values) and their indices and names."""
    from mmdet3d.core.bbox import LiDARInstance3DBoxes
    names = np.asarray(info['gt_names'])
    keep = np.asarray(info.get('valid_flag', info['num_lidar_pts'] > 0), dtype=bool) & np.isin(names, classes)
    velocity = np.nan_to_num(np.asarray(info['gt_velocity'], dtype=np.float64).reshape(-1, 2))
    boxes = np.concatenate([np.asarray(info['gt_boxes'], dtype=np.float64).reshape(-1, 7), velocity], axis=1)
    indices = np.nonzero(keep)[0]
    return LiDARInstance3DBoxes(boxes[indices], box_dim=9, origin=(0.5, 0.5, 0.5)), indices, names[indices]


def camera_views(info: dict) -> Dict[str, dict]:
    """Per camera of an info: its image ``[H, W, 3]`` and ``lidar2img`` ``[4, 4]``.

    Raises:
        FileNotFoundError: naming a missing image.
    """
    views = {}
    for camera, cam_info in info['cams'].items():
        path = require_file(cam_info['data_path'], f'{camera} image')
        lidar2cam = lidar2cam_from_sensor2lidar(cam_info['sensor2lidar_rotation'], cam_info['sensor2lidar_translation'])
        lidar2img = compose_lidar2img([pad_intrinsic(cam_info['cam_intrinsic'])], [lidar2cam])[0]
        views[camera] = dict(image=cv2.imread(path, cv2.IMREAD_UNCHANGED), lidar2img=lidar2img)
    return views


def load_sample_points(info: dict, key_frame_loader, sweeps_loader) -> np.ndarray:
    """Key frame + sweeps of one info, ``[P, 5]``, as the training pipeline loads them.

    Raises:
        FileNotFoundError: naming a missing LiDAR or sweep file.
    """
    require_file(info['lidar_path'], 'LiDAR file')
    for sweep in info['sweeps']:
        require_file(sweep['data_path'], 'LiDAR sweep file')
    results = sweeps_loader(key_frame_loader(dict(pts_filename=info['lidar_path'], sweeps=info['sweeps'],
                                                  timestamp=info['timestamp'] / 1e6)))
    return results['points'].tensor.numpy()


def write_patches(views: Dict[str, dict], projections: Dict[str, tuple], obj: int, out_dir: str,
                  stem_path: str) -> Dict[str, dict]:
    """Write object ``obj``'s patch of every camera that sees it; returns camera -> ``path``, ``rect``, ``depth``."""
    patches = {}
    for camera, (rects, depth, visible) in projections.items():
        if not visible[obj]:
            continue
        x1, y1, x2, y2 = (int(v) for v in rects[obj])
        patch_path = f'{stem_path}_{camera}.png'
        cv2.imwrite(osp.join(out_dir, patch_path), views[camera]['image'][y1:y2, x1:x2])
        patches[camera] = dict(path=patch_path, rect=(x1, y1, x2, y2), depth=float(depth[obj]))
    return patches


def largest_patch(patches: Dict[str, dict]) -> str:
    """The camera whose patch has the largest area (``''`` when there is none)."""
    def area(camera: str) -> int:
        x1, y1, x2, y2 = patches[camera]['rect']
        return (x2 - x1) * (y2 - y1)
    return max(patches, key=area, default='')


def create_groundtruth_database(info_path: str, out_dir: str, info_prefix: str = 'nuscenes',
                                classes: Optional[Sequence[str]] = None, max_sweeps: int = 10,
                                min_patch_size: int = 4, expected_version: Optional[str] = None,
                                verbose: bool = True) -> str:
    """Write the GT database of the training infos in ``info_path``.

    Args:
        info_path: ``<prefix>_infos_train.pkl``.
        out_dir: where ``<prefix>_gt_database/`` and ``<prefix>_dbinfos_train.pkl`` go.
        info_prefix: file name prefix.
        classes: class names to store (default: the 10 nuScenes detection classes).
        max_sweeps: LiDAR sweeps merged into each object's points.
        min_patch_size: smallest patch width / height in pixels.
        expected_version: when given, the info file must be of that nuScenes version.
        verbose: print progress.

    Returns:
        str: the path of the written ``<prefix>_dbinfos_train.pkl``.

    Raises:
        FileNotFoundError: naming a missing info, LiDAR, sweep or image file.
        ValueError: the info file is of another version.
    """
    from nuscenes.eval.detection.constants import DETECTION_NAMES
    classes = list(classes or DETECTION_NAMES)
    infos = load_infos(info_path, expected_version)['infos']
    database_dir = f'{info_prefix}_gt_database'
    for sub in ('pts_dir', 'img_dir'):
        os.makedirs(osp.join(out_dir, database_dir, sub), exist_ok=True)
    key_frame_loader, sweeps_loader = _points_loaders(max_sweeps)
    db_infos: Dict[str, List[dict]] = {}
    group_id = 0
    for index, info in enumerate(infos):
        points = load_sample_points(info, key_frame_loader, sweeps_loader)
        boxes, gt_indices, names = info_boxes(info, classes)
        box_array = boxes.tensor.numpy()
        inside = points_in_boxes(points, box_array)
        corners = boxes.corners.numpy()
        views = camera_views(info)
        projections = {camera: box_image_rects(corners, view['lidar2img'], view['image'].shape[:2], min_patch_size)
                       for camera, view in views.items()}
        for obj, (gt_index, name) in enumerate(zip(gt_indices, names)):
            stem = f'{info["token"]}_{name}_{gt_index}'
            object_points = points[inside[:, obj]].astype(np.float32)
            object_points[:, :3] -= box_array[obj, :3]
            points_path = osp.join(database_dir, 'pts_dir', f'{stem}.bin')
            object_points.tofile(osp.join(out_dir, points_path))
            patches = write_patches(views, projections, obj, out_dir, osp.join(database_dir, 'img_dir', stem))
            largest = largest_patch(patches)
            db_infos.setdefault(str(name), []).append(dict(
                name=str(name), path=points_path, image_idx=info['token'], gt_idx=int(gt_index),
                box3d_lidar=box_array[obj].astype(np.float32), num_points_in_gt=int(len(object_points)),
                point_dims=POINT_DIMS, difficulty=0, group_id=group_id, image_patches=patches,
                image_path=patches[largest]['path'] if largest else '', image_crop_key=largest,
                image_crop_depth=patches[largest]['depth'] if largest else 0.0))
            group_id += 1
        report_progress(index + 1, len(infos), 'GT database', verbose)
    db_info_path = osp.join(out_dir, f'{info_prefix}_dbinfos_train.pkl')
    with open(db_info_path, 'wb') as f:
        pickle.dump(db_infos, f)
    if verbose:
        counts = ', '.join(f'{name} {len(v)}' for name, v in sorted(db_infos.items()))
        print(f'  GT database: {group_id} objects ({counts or "none"}) -> {db_info_path}')
    return db_info_path
