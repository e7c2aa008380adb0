"""GT-database sampler that returns, with each sampled object, its LiDAR points and its camera image patches.

The database is written by ``tools/create_data.py nuscenes`` (see
``tools/data_converter/gt_database.py``): ``<prefix>_dbinfos_train.pkl``
maps each class name to a list of dicts with

* ``name`` (str), ``path`` (str): the object's points, float32
  ``[P, point_dims]`` relative to the bottom centre of its box;
* ``box3d_lidar`` ``[D]``: the box in mmdet3d's ``LiDARInstance3DBoxes``
  layout (bottom centre, ``dx, dy, dz, yaw``, then velocity ``vx, vy``);
* ``num_points_in_gt`` (int), ``point_dims`` (int, values per point),
  ``difficulty`` (int), ``group_id`` (int), ``image_idx`` (sample token),
  ``gt_idx`` (int);
* ``image_patches`` (dict camera name -> dict ``path``, ``rect``
  ``(x1, y1, x2, y2)``, ``depth``): the object's pixels in every camera that
  sees it whole enough (see the converter), and the upstream CMT keys
  ``image_path`` / ``image_crop_key`` / ``image_crop_depth`` naming its
  largest patch (``''`` when no camera sees it).

Relative paths are resolved against ``data_root``, or, when that is None,
against the folder of ``info_path`` (where ``create_data`` writes both).
"""
import copy
import os.path as osp
from typing import Dict, List, Mapping, Optional, Sequence

import mmcv
import numpy as np
from mmdet3d.core.points import BasePoints
from mmdet3d.datasets.builder import OBJECTSAMPLERS, PIPELINES
from mmdet3d.datasets.pipelines.dbsampler import BatchSampler
from mmdet3d.utils import get_root_logger

from ..box_geometry import bev_overlaps

def filter_by_difficulty(db_infos: Dict[str, List[dict]], removed_difficulty: Sequence[int]) -> Dict[str, List[dict]]:
    """Drop the objects whose ``difficulty`` is in ``removed_difficulty``."""
    return {name: [info for info in infos if info['difficulty'] not in removed_difficulty]
            for name, infos in db_infos.items()}


def filter_by_min_points(db_infos: Dict[str, List[dict]], min_points: Mapping[str, int]) -> Dict[str, List[dict]]:
    """Drop the objects of each listed class with fewer than ``min_points[class]`` LiDAR points."""
    return {name: [info for info in infos if info['num_points_in_gt'] >= int(min_points.get(name, 0))]
            for name, infos in db_infos.items()}


PREPARE_FUNCTIONS = dict(filter_by_difficulty=filter_by_difficulty, filter_by_min_points=filter_by_min_points)
DEFAULT_POINTS_LOADER = dict(type='LoadPointsFromFile', coord_type='LIDAR', load_dim=5, use_dim=[0, 1, 2, 3, 4])


@OBJECTSAMPLERS.register_module()
class UnifiedDataBaseSampler:
    """Draw GT-database objects (points + image patches) that collide with no box of the scene.

    Args:
        info_path (str): the database info pickle.
        data_root (str, optional): folder the database paths are relative
            to; None means the folder of ``info_path``.
        rate (float): fraction of the missing objects actually sampled.
        prepare (dict): filters applied to the database at load time, by
            name: ``filter_by_difficulty`` (list of difficulties to drop),
            ``filter_by_min_points`` (dict class -> minimum point count).
        sample_groups (dict): class name -> number of objects of that class a
            sample should have after sampling.
        classes (list[str]): class names; a label is an index into it.
        points_loader (dict, optional): config of the pipeline that loads an
            object's points file (default: ``LoadPointsFromFile`` with
            ``load_dim=5``); its ``load_dim`` must equal the ``point_dims``
            the converter recorded, else ``ValueError``.
    """

    def __init__(self, info_path: str, data_root: Optional[str] = None, rate: float = 1.0,
                 prepare: Optional[Dict] = None, sample_groups: Optional[Dict[str, int]] = None,
                 classes: Optional[Sequence[str]] = None, points_loader: Optional[Dict] = None) -> None:
        if not classes:
            raise ValueError('UnifiedDataBaseSampler needs the class names (classes=[...])')
        if not osp.isfile(info_path):
            raise FileNotFoundError(f'GT database info file not found: {info_path} (create it with '
                                    f'tools/create_data.py nuscenes)')
        sample_groups = dict(sample_groups or {})
        unknown = sorted(set(sample_groups) - set(classes))
        if unknown:
            raise ValueError(f'UnifiedDataBaseSampler: sample_groups names classes {unknown} that are not in '
                             f'classes {list(classes)}')
        self.info_path = info_path
        self.data_root = osp.dirname(osp.abspath(info_path)) if data_root is None else data_root
        self.rate = rate
        self.classes = list(classes)
        self.cat2label = {name: i for i, name in enumerate(self.classes)}
        self.sample_groups = {name: int(num) for name, num in sample_groups.items()}
        self.points_loader = mmcv.build_from_cfg(points_loader or DEFAULT_POINTS_LOADER, PIPELINES)

        db_infos = mmcv.load(info_path, file_format='pkl')
        if not isinstance(db_infos, dict):
            raise ValueError(f'{info_path} is not a GT database info file (expected a dict class name -> list)')
        for prepare_name, value in (prepare or {}).items():
            if prepare_name not in PREPARE_FUNCTIONS:
                raise ValueError(f'UnifiedDataBaseSampler: unknown prepare step {prepare_name!r}; expected one '
                                 f'of {sorted(PREPARE_FUNCTIONS)}')
            db_infos = PREPARE_FUNCTIONS[prepare_name](db_infos, value)
        self._check_point_dims(db_infos)
        logger = get_root_logger()
        logger.info('GT database %s: %s', info_path,
                    ', '.join(f'{name} {len(infos)}' for name, infos in sorted(db_infos.items())))
        self.db_infos = db_infos
        self.batch_samplers = {name: BatchSampler(infos, name, shuffle=True)
                               for name, infos in db_infos.items() if infos}

    def _check_point_dims(self, db_infos: Dict[str, List[dict]]) -> None:
        load_dim = getattr(self.points_loader, 'load_dim', None)
        for infos in db_infos.values():
            for info in infos[:1]:
                if 'point_dims' in info and load_dim is not None and info['point_dims'] != load_dim:
                    raise ValueError(f'GT database {self.info_path} stores {info["point_dims"]} values per point but '
                                     f'points_loader has load_dim={load_dim}')

    def _path(self, relative: str) -> str:
        return relative if osp.isabs(relative) else osp.join(self.data_root, relative)

    def _draw_class(self, name: str, num: int, scene_boxes: np.ndarray) -> List[dict]:
        """Up to ``num`` objects of class ``name`` whose BEV boxes overlap neither ``scene_boxes`` nor each other."""
        candidates = copy.deepcopy(self.batch_samplers[name].sample(num))
        boxes = np.stack([info['box3d_lidar'] for info in candidates])
        collides_scene = bev_overlaps(boxes, scene_boxes).any(axis=1)
        pairwise = bev_overlaps(boxes, boxes)
        accepted: List[int] = []
        for i in range(len(candidates)):
            if not collides_scene[i] and not pairwise[i, accepted].any():
                accepted.append(i)
        return [candidates[i] for i in accepted]

    def sample_all(self, gt_bboxes: np.ndarray, gt_labels: np.ndarray, with_img: bool = False) -> Optional[Dict]:
        """Sample objects for one scene.

        Args:
            gt_bboxes: ``[N, D]`` the scene's boxes (``LiDARInstance3DBoxes.tensor`` layout).
            gt_labels: ``[N]`` their labels.
            with_img: also load each object's image patches.

        Returns:
            dict | None: None when nothing was sampled, else ``gt_bboxes_3d``
            ``[S, D]``, ``gt_labels_3d`` ``[S]``, ``points`` (``BasePoints``
            in the scene's LiDAR frame), ``points_box_index`` ``[P]`` (which
            sampled object each point belongs to) and, with ``with_img``,
            ``images``: per object a dict camera name -> patch ``[h, w, 3]``
            plus the key ``None`` for its largest patch (absent when no camera
            saw it).
        """
        gt_bboxes = np.asarray(gt_bboxes, dtype=np.float32)
        if gt_bboxes.ndim != 2 or len(gt_bboxes) != len(gt_labels):
            raise ValueError(f'sample_all needs gt_bboxes [N, D] and gt_labels [N], got {gt_bboxes.shape} and '
                             f'{np.shape(gt_labels)}')
        scene_boxes = gt_bboxes
        sampled: List[dict] = []
        for name, wanted in self.sample_groups.items():
            missing = wanted - int(np.sum(np.asarray(gt_labels) == self.cat2label[name]))
            num = int(np.round(self.rate * missing))
            if num <= 0 or name not in self.batch_samplers:
                continue
            drawn = self._draw_class(name, num, scene_boxes)
            if drawn:
                sampled += drawn
                scene_boxes = np.concatenate([scene_boxes, np.stack([info['box3d_lidar'] for info in drawn])])
        if not sampled:
            return None
        boxes = np.stack([info['box3d_lidar'] for info in sampled]).astype(np.float32)
        if gt_bboxes.shape[1] and boxes.shape[1] != gt_bboxes.shape[1]:
            raise ValueError(f'GT database {self.info_path} stores {boxes.shape[1]}-value boxes but the scene has '
                             f'{gt_bboxes.shape[1]}-value boxes (with_velocity must match the database)')
        points_list, box_index = [], []
        for index, info in enumerate(sampled):
            points_list.append(self.object_points(info))
            box_index.append(np.full(len(points_list[-1]), index, dtype=np.int64))
        result = dict(gt_bboxes_3d=boxes,
                      gt_labels_3d=np.array([self.cat2label[info['name']] for info in sampled], dtype=np.int64),
                      points=points_list[0].cat(points_list), points_box_index=np.concatenate(box_index))
        if with_img:
            result['images'] = [self._load_patches(info) for info in sampled]
        return result

    def object_points(self, info: dict) -> BasePoints:
        """The LiDAR points of the database object ``info``, where its box is in its source frame, every column."""
        path = self._path(info['path'])
        if not osp.isfile(path):
            raise FileNotFoundError(f'GT database points file not found: {path} (listed in {self.info_path})')
        points = self.points_loader(dict(pts_filename=path))['points']
        points.translate(info['box3d_lidar'][:3])
        return points

    def _load_patches(self, info: dict) -> Dict[Optional[str], np.ndarray]:
        patches: Dict[Optional[str], np.ndarray] = {}
        for camera, patch in info.get('image_patches', {}).items():
            path = self._path(patch['path'])
            if not osp.isfile(path):
                raise FileNotFoundError(f'GT database image patch not found: {path} (listed in {self.info_path})')
            patches[camera] = mmcv.imread(path, 'unchanged')
        if info.get('image_crop_key') in patches:
            patches[None] = patches[info['image_crop_key']]
        return patches

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(info_path={self.info_path!r}, data_root={self.data_root!r}, '
                f'rate={self.rate}, sample_groups={self.sample_groups})')
