"""Test-time sensor corruptions for robustness evaluation: sensors that go silent and sensors that lie.

A corruption is written ``mode[:arg[:arg]]`` on the command line (``corruption_spec.py`` parses it) and applied
by the registered transform :class:`SensorCorruption`, right after the loading steps of the test pipeline
(``datasets/corruption_config.py`` puts it there). Absent evidence:

* ``lidar_drop`` (no point), ``camera_drop`` (every image black), ``view_drop:N`` (view ``N`` black),
  ``fov:DEG`` (only the points within ``DEG / 2`` of the front camera's axis), ``beams:K`` (``K`` evenly spread
  beams), ``points:R`` (a random fraction ``R``), ``camera_fail:P`` (each view black with probability ``P``);
* ``object_drop:P``: each ground-truth object, with probability ``P``, loses its LiDAR points (box + margin,
  each sweep where the object was at its time);
* ``mixed:DEG``: the points of a random ``DEG``-degree sector and the cameras facing the opposite one lost.

Plausible but wrong evidence (the lies):

* ``extrinsic:DEG``: every camera's ``lidar2cam`` / ``lidar2img`` rotated by ``DEG`` about a random axis;
* ``view_yaw:V:DEG``: the calibration of ``V`` random views rotated by ``DEG`` about the camera's vertical axis;
* ``lidar_ghost:N``: ``N`` GT-database objects in the point cloud only, with their shadows (``lidar_ghosts.py``);
* ``lidar_misalign:P:DEG``: in a fraction ``P`` of the frames, the point cloud rotated and shifted against the
  cameras (MultiCorrupt's spatial misalignment);
* ``mixed_lie:DEG``: ghosts in a random ``DEG``-degree sector, yawed calibrations of the cameras facing the
  opposite one.

Images are never changed by a lie; the ground truth never is. Randomness is seeded per sample from ``seed`` and the
sample token, so an evaluation is reproducible and independent of the order in which samples are loaded.
"""
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.datasets.builder import PIPELINES

from ..box_geometry import points_in_boxes
from ..corruption_geometry import (axis_angle_rotation, beam_indices, boxes_at_time_lag, camera_forward_yaw,
                                   camera_yaw_rotation, enlarged_boxes, fov_mask, kept_beams, lidar_misalignment,
                                   points_in_sweep_frames)
from .corruption_spec import (CORRUPTION_FORMS, CORRUPTION_MODES, GHOST_MODES, MIXED_LIE_GHOSTS, VIEW_YAW_DEG,
                              check_corruption_argument, corruption_mode, corruption_name, parse_corruption)
from .lidar_ghosts import GhostPlacer

# the spec's names are importable from here too (for the modules that import them from here)
__all__ = ['CORRUPTION_KEY', 'AUGMENTATION_META_KEYS', 'SensorCorruption', 'sample_rng', 'CORRUPTION_FORMS',
           'CORRUPTION_MODES', 'GHOST_MODES', 'MIXED_LIE_GHOSTS', 'VIEW_YAW_DEG', 'corruption_mode', 'parse_corruption']

#: results / img_metas key describing the applied corruption (add it to Collect3D's meta_keys).
CORRUPTION_KEY = 'corruption'
#: The img_metas keys of the training pipeline's 3D augmentation, with which a model moves the recorded ghost boxes
#: (recorded where they were placed) to where their points are (``models/aqr/sensor_lies.py``).
AUGMENTATION_META_KEYS = ('transformation_3d_flow', 'pcd_rotation', 'pcd_scale_factor', 'pcd_trans',
                          'pcd_horizontal_flip', 'pcd_vertical_flip')
#: Beams and elevation limits (degrees) of the nuScenes LiDAR, a Velodyne HDL-32E (uniformly spaced beams).
HDL32E_BEAMS = 32
HDL32E_ELEVATION_RANGE_DEG = (-30.67, 10.67)

#: ``lidar_misalign``: metres the point cloud moves along LiDAR +x (MultiCorrupt's spatial misalignment).
MISALIGNMENT_SHIFT_M = 2.0
#: The fusion configs' point cloud range: where ghosts are placed unless ``point_cloud_range`` says otherwise.
DEFAULT_POINT_CLOUD_RANGE = (-54.0, -54.0, -5.0, 54.0, 54.0, 3.0)

def sample_rng(seed: int, sample_key: str) -> np.random.Generator:
    """Random generator of one sample: a function of ``seed`` and the sample's token only."""
    return np.random.default_rng([int(seed), zlib.crc32(str(sample_key).encode())])


@PIPELINES.register_module()
class SensorCorruption:
    """Corrupt the LiDAR points or the cameras of a test sample (see the module docstring for the modes).

    Put it right after the loading steps (``LoadPointsFromFile``,
    ``LoadPointsFromMultiSweeps``, ``LoadMultiViewImageFromFiles``) and
    before any image resizing, normalisation or 3D augmentation:
    ``datasets.corruption_config.insert_corruption`` does so. Black then
    means pixels of value 0, which normalisation turns into ``-mean / std``.
    Sets ``results['corruption']``: ``name`` (CLI form), ``mode``, its
    arguments, and per mode ``camera`` / ``views`` (the black views),
    ``forward_yaw_deg`` (``fov``), ``kept_beams`` (``beams``), ``seed`` (random
    modes), ``dropped_objects`` / ``num_objects`` (``object_drop``),
    ``rotation_axes`` (``extrinsic``: per view, in its camera frame),
    ``yawed_views`` (``view_yaw``, ``mixed_lie``), ``ghost_boxes`` /
    ``ghost_names`` / ``ghost_sources`` / ``num_shadowed_points`` /
    ``num_ghost_points`` (``lidar_ghost``, ``mixed_lie``: see
    ``lidar_ghosts.GhostPlacer``), ``misaligned`` (``lidar_misalign``),
    ``lidar_sector_deg`` / ``camera_sector_deg`` (``mixed``, ``mixed_lie``:
    the sector centres, as yaws in the LiDAR frame), ``num_points_before`` /
    ``num_points_after`` (modes that change the points). Add ``'corruption'``
    to ``Collect3D``'s ``meta_keys`` to see it in ``img_metas``.

    Args:
        mode (str): one of the keys of :data:`CORRUPTION_MODES`.
        view (int, optional): ``view_drop``: index of the camera view made black.
        fov_deg (float, optional): ``fov``: the kept field of view in degrees, centred on the forward direction.
        keep_beams (int, optional): ``beams``: number of beams kept.
        keep_ratio (float, optional): ``points``: fraction of the points kept.
        drop_prob (float, optional): ``object_drop``: probability that an object loses its points.
        fail_prob (float, optional): ``camera_fail``: probability that a camera view is black.
        rotation_deg (float, optional): ``extrinsic``: rotation of every camera's extrinsics, in degrees;
            ``lidar_misalign``: rotation about each LiDAR axis.
        sector_deg (float, optional): ``mixed``, ``mixed_lie``: width of the two opposite sectors.
        num_ghosts (int, optional): ``lidar_ghost``: ghosts wanted; ``mixed_lie``: in its sector (default
            :data:`MIXED_LIE_GHOSTS`).
        num_views (int, optional): ``view_yaw``: number of views whose calibration is yawed.
        yaw_deg (float, optional): ``view_yaw``, ``mixed_lie`` (default :data:`VIEW_YAW_DEG`): the yaw.
        frame_prob (float, optional): ``lidar_misalign``: probability that a frame is misaligned.
        ghost_database (dict, optional): ``lidar_ghost``, ``mixed_lie``: config of the GT-database sampler the
            ghosts come from (a config's ``db_sampler``); not loaded when the points are an unread input.
        point_cloud_range (Sequence[float]): ``lidar_ghost``, ``mixed_lie``: the range every ghost lies in.
        object_margin (float): ``object_drop``: metres added to every side of the boxes. Default: 0.25.
        seed (int): base seed of the random modes.
        forward_camera (str): ``fov``: the camera whose optical axis is the forward direction.
        forward_yaw_deg (float, optional): ``fov``: the forward direction as a yaw in the LiDAR frame
            (degrees from +x towards +y) instead of the camera's (for LiDAR-only pipelines; nuScenes: 90).
        lidar_beams (int): ``beams``: number of beams of the LiDAR (nuScenes: 32).
        elevation_range_deg (tuple[float, float]): ``beams``: elevations of its lowest and highest beam.
        sweep_time_column (int, optional): ``beams``, ``object_drop``: the points' column holding the sweep
            time lag written by ``LoadPointsFromMultiSweeps`` (``None``: no sweeps were loaded). The beam of a
            point is found from its elevation in the LiDAR frame it was measured in, so the sweeps must be
            mapped back; an object's sweep points lie where the object was at the sweep's time.
        inputs (Sequence[str], optional): the inputs it corrupts, some of the mode's (default: all of them).
            The others are inputs the model does not read (a camera-only model under ``lidar_drop`` or
            ``mixed``: ``datasets.corruption_config.insert_corruption`` leaves out an input its pipeline never
            loads); they are recorded as ``unread_inputs``, and the corruption changes nothing of them.
    """

    def __init__(self, mode: str, view: Optional[int] = None, fov_deg: Optional[float] = None,
                 keep_beams: Optional[int] = None, keep_ratio: Optional[float] = None,
                 drop_prob: Optional[float] = None, fail_prob: Optional[float] = None,
                 rotation_deg: Optional[float] = None, sector_deg: Optional[float] = None,
                 num_ghosts: Optional[int] = None, num_views: Optional[int] = None, yaw_deg: Optional[float] = None,
                 frame_prob: Optional[float] = None, ghost_database: Optional[Dict] = None,
                 point_cloud_range: Sequence[float] = DEFAULT_POINT_CLOUD_RANGE,
                 object_margin: float = 0.25, seed: int = 0,
                 forward_camera: str = 'CAM_FRONT', forward_yaw_deg: Optional[float] = None,
                 lidar_beams: int = HDL32E_BEAMS,
                 elevation_range_deg: Tuple[float, float] = HDL32E_ELEVATION_RANGE_DEG,
                 sweep_time_column: Optional[int] = None, inputs: Optional[Sequence[str]] = None) -> None:
        spec = corruption_mode(mode)
        if inputs is not None and not set(inputs) <= set(spec.input_keys):
            raise ValueError(f'SensorCorruption: mode {mode!r} corrupts {list(spec.input_keys)}, not {list(inputs)}')
        given = dict(view=view, fov_deg=fov_deg, keep_beams=keep_beams, keep_ratio=keep_ratio, drop_prob=drop_prob,
                     fail_prob=fail_prob, rotation_deg=rotation_deg, sector_deg=sector_deg, num_ghosts=num_ghosts,
                     num_views=num_views, yaw_deg=yaw_deg, frame_prob=frame_prob)
        options = dict(spec.options)
        foreign = [name for name, value in given.items()
                   if value is not None and name not in spec.arg_names and name not in options]
        if foreign:
            raise ValueError(f'SensorCorruption: {foreign} are not arguments of mode {mode!r}')
        if object_margin < 0:
            raise ValueError(f'SensorCorruption: object_margin must be >= 0, got {object_margin}')
        self.mode = mode
        self.input_keys = tuple(key for key in spec.input_keys if inputs is None or key in inputs)
        self.unread_inputs = tuple(key for key in spec.input_keys if key not in self.input_keys)
        self.random = spec.random
        #: the mode's arguments (CLI order), then its options, by name
        self.args = {name: check_corruption_argument(mode, name, given[name]) for name in spec.arg_names}
        self.args.update({name: check_corruption_argument(mode, name, default if given[name] is None
                                                          else given[name]) for name, default in options.items()})
        self.name = corruption_name(mode, *(self.args[name] for name in spec.arg_names))
        if mode == 'beams' and not (self.args['keep_beams'] <= lidar_beams and lidar_beams >= 2
                                    and elevation_range_deg[0] < elevation_range_deg[1]):
            raise ValueError(f'SensorCorruption({self.name}): cannot keep {self.args["keep_beams"]} beams of a LiDAR '
                             f'with lidar_beams={lidar_beams}, elevation_range_deg={elevation_range_deg}')
        places_ghosts = mode in GHOST_MODES and 'points' in self.input_keys
        if places_ghosts and ghost_database is None:
            raise ValueError(f'SensorCorruption({self.name}) needs ghost_database: the config of the GT-database '
                             f'sampler its ghosts come from (the config\'s db_sampler; corrupt_config passes it)')
        if mode not in GHOST_MODES and ghost_database is not None:
            raise ValueError(f'SensorCorruption({self.name}): ghost_database is only for {", ".join(GHOST_MODES)}')
        self.ghosts = GhostPlacer(ghost_database, point_cloud_range) if places_ghosts else None
        self.object_margin = float(object_margin)
        self.seed = seed
        self.forward_camera = forward_camera
        self.forward_yaw_deg = forward_yaw_deg
        self.lidar_beams = lidar_beams
        self.elevation_range_deg = tuple(elevation_range_deg)
        self.sweep_time_column = sweep_time_column

    def __call__(self, results: Dict) -> Dict:
        missing = [key for key in self.input_keys if key not in results]
        if missing:
            raise KeyError(f'SensorCorruption({self.name}) needs results{missing}: put it after the loading steps '
                           f'(datasets.corruption_config.insert_corruption does)')
        record = dict(name=self.name, mode=self.mode, **self.args)
        rng = None
        if self.random:
            record['seed'] = self.seed
            rng = self._rng(results)
        if self.unread_inputs:
            record['unread_inputs'] = list(self.unread_inputs)
        if self.mode in ('mixed', 'mixed_lie'):
            lidar_yaw = rng.uniform(-np.pi, np.pi)
            record['lidar_sector_deg'] = float(np.degrees(lidar_yaw))
            record['camera_sector_deg'] = float(np.degrees(np.remainder(lidar_yaw + 2 * np.pi, 2 * np.pi) - np.pi))
        if 'img' in self.input_keys:
            self._corrupt_cameras(results, record, rng)
        if 'points' in self.input_keys:
            self._corrupt_points(results, record, rng)
        results[CORRUPTION_KEY] = record
        return results

    def _rng(self, results: Dict) -> np.random.Generator:
        """The sample's random generator (a fresh one each call, so every draw is a function of the sample)."""
        if 'sample_idx' not in results:
            raise KeyError(f'SensorCorruption({self.name}) needs results["sample_idx"] (the sample token) to seed '
                           f'the sample\'s random draw')
        return sample_rng(self.seed, results['sample_idx'])

    def _corrupt_cameras(self, results: Dict, record: Dict, rng: Optional[np.random.Generator]) -> None:
        if self.mode == 'extrinsic':
            axes = [rng.normal(size=3) for _ in range(self._num_calibrated_views(results))]
            axes = [axis / np.linalg.norm(axis) for axis in axes]
            for view, axis in enumerate(axes):
                self._rotate_calibration(results, view, axis_angle_rotation(axis, self.args['rotation_deg']))
            record['rotation_axes'] = [axis.tolist() for axis in axes]
        elif self.mode in ('view_yaw', 'mixed_lie'):
            num_views = self._num_calibrated_views(results)
            if self.mode == 'mixed_lie':
                views = self._views_facing(results, record['camera_sector_deg'], num_views)
            elif self.args['num_views'] > num_views:
                raise ValueError(f'SensorCorruption({self.name}): the sample has {num_views} camera views, fewer '
                                 f'than the {self.args["num_views"]} to yaw')
            else:
                views = sorted(rng.choice(num_views, self.args['num_views'], replace=False).tolist())
            for view in views:
                self._rotate_calibration(results, view, camera_yaw_rotation(self.args['yaw_deg']))
            record['yawed_views'] = views
        else:
            self._black_out_views(results, record, rng)

    def _num_calibrated_views(self, results: Dict) -> int:
        missing = [key for key in ('lidar2cam', 'cam_intrinsic', 'lidar2img') if key not in results]
        if missing:
            raise KeyError(f'SensorCorruption({self.name}) needs the camera calibration results{missing} '
                           f'(CustomNuScenesDataset with use_camera=True provides it)')
        return len(results['lidar2cam'])

    @staticmethod
    def _rotate_calibration(results: Dict, view: int, rotation: np.ndarray) -> None:
        """``lidar2cam`` of ``view`` rotated in its camera frame (``R @ lidar2cam``), ``lidar2img`` recomposed.

        In place: the lists' arrays are shared with the ``extrinsics`` / ``intrinsics`` aliases.
        """
        transform = np.eye(4)
        transform[:3, :3] = rotation
        lidar2cam = results['lidar2cam'][view]
        lidar2cam[...] = transform @ np.asarray(lidar2cam, dtype=np.float64)
        results['lidar2img'][view][...] = np.asarray(results['cam_intrinsic'][view], dtype=np.float64) @ lidar2cam

    def _black_out_views(self, results: Dict, record: Dict, rng: Optional[np.random.Generator]) -> None:
        images = results['img']
        if not isinstance(images, (list, tuple)):
            raise TypeError(f'SensorCorruption({self.name}) needs results["img"] as a list of per-view images '
                            f'(LoadMultiViewImageFromFiles), got {type(images).__name__}')
        views = self._failed_views(results, len(images), record, rng)
        record['views'] = views
        results['img'] = [np.zeros_like(img) if view in views else img for view, img in enumerate(images)]

    def _failed_views(self, results: Dict, num_views: int, record: Dict,
                      rng: Optional[np.random.Generator]) -> List[int]:
        """The camera views made black."""
        if self.mode == 'view_drop':
            view = self.args['view']
            if view >= num_views:
                raise ValueError(f'SensorCorruption({self.name}): the sample has {num_views} camera views '
                                 f'(0..{num_views - 1})')
            names = results.get('camera_names')
            record['camera'] = names[view] if names is not None else None
            return [view]
        if self.mode == 'camera_fail':
            return np.flatnonzero(rng.random(num_views) < self.args['fail_prob']).tolist()
        if self.mode == 'mixed':
            return self._views_facing(results, record['camera_sector_deg'], num_views)
        return list(range(num_views))

    def _views_facing(self, results: Dict, centre_deg: float, num_views: int) -> List[int]:
        """The views whose optical axis (on the LiDAR x-y plane) is within ``sector_deg / 2`` of ``centre_deg``."""
        if 'lidar2cam' not in results or len(results['lidar2cam']) != num_views:
            raise KeyError(f'SensorCorruption({self.name}) needs the calibration of every camera '
                           f'(results["lidar2cam"], one per view) to find the cameras of its sector')
        yaws = np.array([camera_forward_yaw(lidar2cam) for lidar2cam in results['lidar2cam']])
        facing = fov_mask(np.stack([np.cos(yaws), np.sin(yaws)], 1), np.deg2rad(centre_deg), self.args['sector_deg'])
        return np.flatnonzero(facing).tolist()

    def _corrupt_points(self, results: Dict, record: Dict, rng: Optional[np.random.Generator]) -> None:
        points = results['points']
        if self.mode in GHOST_MODES:
            sector = (record['lidar_sector_deg'], self.args['sector_deg']) if self.mode == 'mixed_lie' else None
            changed, ghosts = self.ghosts(points.tensor.numpy(), rng, self.args['num_ghosts'],
                                          self._scene_boxes(results), sector)
            record.update(ghosts)
            results['points'] = points.new_point(changed)
        elif self.mode == 'lidar_misalign':
            record['misaligned'] = bool(rng.random() < self.args['frame_prob'])
            if record['misaligned']:
                transform = lidar_misalignment(self.args['rotation_deg'], MISALIGNMENT_SHIFT_M)
                moved = points.tensor.numpy().astype(np.float64)
                moved[:, :3] = moved[:, :3] @ transform[:3, :3].T + transform[:3, 3]
                results['points'] = points.new_point(moved.astype(points.tensor.numpy().dtype))
        else:
            keep = self._kept_points(results, points.tensor.numpy(), record, rng)
            results['points'] = points[torch.from_numpy(keep)]
        record.update(num_points_before=len(points), num_points_after=len(results['points']))

    def _scene_boxes(self, results: Dict) -> np.ndarray:
        """``[M, D]`` the boxes of the sample: those pasted by ``UnifiedObjectSample`` in training too."""
        if 'gt_bboxes_3d' in results:
            return results['gt_bboxes_3d'].tensor.numpy()
        return self._annotated_boxes(results)

    def _annotated_boxes(self, results: Dict) -> np.ndarray:
        """``[M, D]`` the boxes of the sample's annotations."""
        boxes = results.get('ann_info', {}).get('gt_bboxes_3d')
        if boxes is None:
            raise KeyError(f'SensorCorruption({self.name}) needs the ground-truth boxes at test time '
                           f'(results["ann_info"]["gt_bboxes_3d"]); CustomNuScenesDataset provides them when the '
                           f'info file has annotations (not for the nuScenes test split)')
        return boxes.tensor.numpy() if hasattr(boxes, 'tensor') else np.asarray(boxes)

    def _kept_points(self, results: Dict, points: np.ndarray, record: Dict,
                     rng: Optional[np.random.Generator]) -> np.ndarray:
        """``[N]`` bool mask of the points kept, for ``points`` ``[N, C]`` (xyz first)."""
        if self.mode == 'lidar_drop':
            return np.zeros(len(points), dtype=bool)
        if self.mode == 'fov':
            forward_yaw = self._forward_yaw(results)
            record['forward_yaw_deg'] = float(np.degrees(forward_yaw))
            return fov_mask(points[:, :2], forward_yaw, self.args['fov_deg'])
        if self.mode == 'mixed':
            return ~fov_mask(points[:, :2], np.deg2rad(record['lidar_sector_deg']), self.args['sector_deg'])
        if self.mode == 'beams':
            xyz = points[:, :3]
            if self.sweep_time_column is not None:
                xyz = points_in_sweep_frames(xyz, points[:, self.sweep_time_column], results['sweeps'],
                                             results['timestamp'])
            kept = kept_beams(self.lidar_beams, self.args['keep_beams'])
            record['kept_beams'] = kept.tolist()
            return np.isin(beam_indices(xyz, self.lidar_beams, self.elevation_range_deg), kept)
        if self.mode == 'object_drop':
            return self._points_outside_dropped_objects(results, points, record, rng)
        keep = np.zeros(len(points), dtype=bool)
        num_kept = int(round(self.args['keep_ratio'] * len(points)))
        keep[rng.choice(len(points), num_kept, replace=False)] = True
        return keep

    def _points_outside_dropped_objects(self, results: Dict, points: np.ndarray, record: Dict,
                                        rng: np.random.Generator) -> np.ndarray:
        boxes = self._annotated_boxes(results)
        dropped = np.flatnonzero(rng.random(len(boxes)) < self.args['drop_prob'])
        record.update(num_objects=int(len(boxes)), dropped_objects=dropped.tolist())
        if not len(dropped) or not len(points):
            return np.ones(len(points), dtype=bool)
        grown = enlarged_boxes(boxes[dropped], self.object_margin)
        if self.sweep_time_column is None or boxes.shape[1] < 9:
            return ~points_in_boxes(points[:, :3], grown).any(1)
        # each sweep against the boxes where the objects were at its time (the sweeps only undo the ego motion)
        time_lags = points[:, self.sweep_time_column]
        keep = np.ones(len(points), dtype=bool)
        for time_lag in np.unique(time_lags):
            selected = time_lags == time_lag
            keep[selected] = ~points_in_boxes(points[selected, :3], boxes_at_time_lag(grown, time_lag)).any(1)
        return keep

    def _forward_yaw(self, results: Dict) -> float:
        if self.forward_yaw_deg is not None:
            return float(np.deg2rad(self.forward_yaw_deg))
        names: Optional[List[str]] = results.get('camera_names')
        if names is None or 'lidar2cam' not in results:
            raise KeyError(f'SensorCorruption({self.name}) takes the forward direction from {self.forward_camera}, '
                           f'but results has no camera calibration ("camera_names", "lidar2cam": load the cameras) '
                           f'-- give forward_yaw_deg instead (nuScenes LIDAR_TOP: 90)')
        if self.forward_camera not in names:
            raise KeyError(f'SensorCorruption({self.name}): no camera {self.forward_camera!r} among {names}')
        return camera_forward_yaw(results['lidar2cam'][names.index(self.forward_camera)])

    def __repr__(self) -> str:
        arguments = ''.join(f'{name}={value}, ' for name, value in self.args.items())
        return (f'{self.__class__.__name__}(mode={self.mode!r}, {arguments}seed={self.seed}, ghosts={self.ghosts}, '
                f'forward_camera={self.forward_camera!r}, forward_yaw_deg={self.forward_yaw_deg}, '
                f'lidar_beams={self.lidar_beams}, elevation_range_deg={self.elevation_range_deg}, '
                f'sweep_time_column={self.sweep_time_column})')
