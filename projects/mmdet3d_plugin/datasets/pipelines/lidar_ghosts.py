"""LiDAR ghosts: GT-database objects placed where nothing stands, with the shadow a real object would cast.

``SensorCorruption``'s ``lidar_ghost`` and ``mixed_lie`` modes (``corruption.py``) use :class:`GhostPlacer`. A
ghost is a database object (class drawn uniformly among the database's classes, then the object uniformly) turned
about the LiDAR's z axis to a new azimuth: it keeps its range, its height and the side the sensor saw of it, so its
points (every column: intensity, sweep time lag) look as the LiDAR would measure them there. It must fit inside the
point cloud range (all corners), overlap in bird's eye view no box of the scene and no other ghost, and show at
least half its points (not behind a scene box or an earlier ghost). Then every point of the scene whose segment
from the sensor origin meets a ghost's box is removed (inside the box or behind it: the ghost's shadow), and every
ghost point whose segment meets a scene box or another ghost's box is left out (hidden behind it). The ground truth
is not changed: a ghost is a lie of the LiDAR, not an object.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mmcv.utils import build_from_cfg
from mmdet3d.datasets.builder import OBJECTSAMPLERS

from ..box_geometry import bev_overlaps, box_corners
from ..corruption_geometry import boxes_rotated_about_origin, segments_through_boxes

#: Draws per ghost before it is given up (a crowded scene or a narrow sector may hold fewer ghosts than asked).
PLACEMENT_TRIES = 50
#: Share of a ghost's points that no box of the scene or earlier ghost may hide (a ghost nobody sees lies to no one).
MIN_VISIBLE_FRACTION = 0.5


class GhostPlacer:
    """Draw ghosts from a GT database, place them in a scene and cut their shadows (see the module docstring).

    Args:
        database (dict): config of the GT-database sampler (``UnifiedDataBaseSampler``, the default ``type``;
            a config's ``db_sampler``); only its objects and its points loader are used.
        point_cloud_range (Sequence[float]): ``[x_min, y_min, z_min, x_max, y_max, z_max]`` that every ghost's
            box lies in.
    """

    def __init__(self, database: Dict, point_cloud_range: Sequence[float]) -> None:
        config = dict(database)
        config.setdefault('type', 'UnifiedDataBaseSampler')
        self.sampler = build_from_cfg(config, OBJECTSAMPLERS)
        self.class_names = sorted(name for name, infos in self.sampler.db_infos.items() if infos)
        if not self.class_names:
            raise ValueError(f'GhostPlacer: the GT database {config.get("info_path")} holds no object')
        self.point_cloud_range = np.asarray(point_cloud_range, dtype=np.float64)
        if self.point_cloud_range.shape != (6, ) or (self.point_cloud_range[:3] >= self.point_cloud_range[3:]).any():
            raise ValueError(f'GhostPlacer: point_cloud_range must be [x_min, y_min, z_min, x_max, y_max, z_max], '
                             f'got {list(point_cloud_range)}')

    def place(self, rng: np.random.Generator, num_ghosts: int, scene_boxes: np.ndarray,
              sector: Optional[Tuple[float, float]] = None) -> Tuple[np.ndarray, List[dict], List[float]]:
        """Up to ``num_ghosts`` ghost boxes that fit (range, overlap, visibility), each from ``PLACEMENT_TRIES`` draws.

        Args:
            rng: the sample's generator.
            num_ghosts: how many ghosts are wanted.
            scene_boxes: ``[M, >=7]`` the scene's boxes.
            sector: ``(centre_deg, width_deg)``: the azimuths (LiDAR frame, degrees from +x towards +y) a ghost's
                centre is drawn from, uniformly; ``None``: all around.

        Returns:
            tuple: the boxes ``[G, D]`` (the database's layout, velocity turned with them), the database infos
            and the turn of each (radians).
        """
        centre, width = (0.0, 360.0) if sector is None else sector
        occupied = np.asarray(scene_boxes, dtype=np.float64)[:, :7].reshape(-1, 7)
        boxes, infos, angles = [], [], []
        for _ in range(num_ghosts):
            for _ in range(PLACEMENT_TRIES):
                infos_of_class = self.sampler.db_infos[self.class_names[rng.integers(len(self.class_names))]]
                info = infos_of_class[rng.integers(len(infos_of_class))]
                source = np.asarray(info['box3d_lidar'], dtype=np.float64)
                azimuth = np.deg2rad(centre + width * (rng.random() - 0.5))
                angle = float(azimuth - np.arctan2(source[1], source[0]))
                box = boxes_rotated_about_origin(source[None], angle)
                if self._fits(box, occupied) and self._visible(info, angle, occupied):
                    boxes.append(box[0])
                    infos.append(info)
                    angles.append(angle)
                    occupied = np.concatenate([occupied, box[:, :7]])
                    break
        columns = len(infos[0]['box3d_lidar']) if infos else occupied.shape[1]
        return np.array(boxes, dtype=np.float64).reshape(-1, columns), infos, angles

    def _fits(self, box: np.ndarray, occupied: np.ndarray) -> bool:
        corners = box_corners(box).reshape(-1, 3)
        inside = ((corners >= self.point_cloud_range[:3]) & (corners <= self.point_cloud_range[3:])).all()
        return bool(inside and not (len(occupied) and bev_overlaps(box, occupied).any()))

    def _visible(self, info: dict, angle: float, occupied: np.ndarray) -> bool:
        """Whether at least :data:`MIN_VISIBLE_FRACTION` of the ghost's points are hidden by no box of ``occupied``."""
        points = self.ghost_points(info, angle)
        hidden = segments_through_boxes(points, occupied).any(1)
        return bool(len(points) and (~hidden).mean() >= MIN_VISIBLE_FRACTION)

    def ghost_points(self, info: dict, angle: float) -> np.ndarray:
        """``[P, C]`` the points of database object ``info`` turned by ``angle`` (rad) about the LiDAR z axis."""
        points = self.sampler.object_points(info).tensor.numpy().astype(np.float64)
        cos, sin = np.cos(angle), np.sin(angle)
        points[:, :2] = points[:, :2] @ np.array([[cos, -sin], [sin, cos]]).T
        return points

    def __call__(self, points: np.ndarray, rng: np.random.Generator, num_ghosts: int, scene_boxes: np.ndarray,
                 sector: Optional[Tuple[float, float]] = None) -> Tuple[np.ndarray, Dict]:
        """The scene's points with the ghosts in and their shadows cut, and the record of what was done.

        Args:
            points: ``[N, C]`` the scene's points (x, y, z first).
            rng, num_ghosts, scene_boxes, sector: as for :meth:`place`.

        Returns:
            tuple: ``[N', C]`` the points (the scene's kept points first, in their order, then the ghosts'), and
            ``ghost_boxes`` (``[G, D]`` as lists), ``ghost_names``, ``ghost_sources`` (``'token:index'`` of
            each database object), ``num_shadowed_points`` (scene points removed), ``num_ghost_points``.

        Raises:
            ValueError: the database's points have another number of columns than the scene's.
        """
        scene_boxes = np.asarray(scene_boxes, dtype=np.float64).reshape(-1, np.shape(scene_boxes)[-1])
        boxes, infos, angles = self.place(rng, num_ghosts, scene_boxes, sector)
        shadow = segments_through_boxes(points, boxes).any(1)
        kept = [np.asarray(points, dtype=np.float64)[~shadow]]
        for index, (info, angle) in enumerate(zip(infos, angles)):
            ghost = self.ghost_points(info, angle)
            if ghost.shape[1] != points.shape[1]:
                raise ValueError(f'the GT database points have {ghost.shape[1]} columns, the scene {points.shape[1]} '
                                 f'(match the database points_loader use_dim to the pipeline\'s)')
            blockers = np.concatenate([scene_boxes[:, :7], np.delete(boxes, index, axis=0)[:, :7]])
            kept.append(ghost[~segments_through_boxes(ghost, blockers).any(1)])
        record = dict(ghost_boxes=boxes.tolist(), ghost_names=[info['name'] for info in infos],
                      ghost_sources=[f"{info.get('image_idx')}:{info.get('gt_idx')}" for info in infos],
                      num_shadowed_points=int(shadow.sum()), num_ghost_points=int(sum(map(len, kept[1:]))))
        return np.concatenate(kept).astype(np.asarray(points).dtype), record

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(database={self.sampler.info_path!r}, '
                f'point_cloud_range={self.point_cloud_range.tolist()})')
