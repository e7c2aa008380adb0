"""Test-time sensor corruptions for robustness evaluation: LiDAR removed, limited or thinned, cameras black.

A corruption is written ``mode[:arg]`` on the command line (:func:`parse_corruption`) and applied by the
registered transform :class:`SensorCorruption`, right after the loading steps of the test pipeline
(``datasets/corruption_config.py`` puts it there):

* ``lidar_drop``: no LiDAR point at all (key frame and sweeps): an empty ``[0, C]`` point cloud.
* ``camera_drop``: every camera image black (pixels 0 before resizing and normalisation, as upstream CMT's
  ``ModalMask3D``); ``view_drop:N``: camera view ``N`` (the dataset's camera order) black.
* ``fov:DEG``: only the LiDAR points whose azimuth is within ``DEG / 2`` of the front camera's optical axis
  (projected onto the LiDAR x-y plane).
* ``beams:K``: only the points of ``K`` beams evenly spread over the vertical field of view (a ``K``-beam sensor);
  ``points:R``: a random fraction ``R`` of the points (``round(R * N)``).
* ``object_drop:P``: each ground-truth object (``results['ann_info']``, never seen by the model), with probability
  ``P``, loses every LiDAR point inside its box enlarged by ``object_margin``, in the key frame and the sweeps
  (with ``sweep_time_column``, boxes moved back by the object's velocity times the sweep's time lag).
* ``camera_fail:P``: each camera view black, independently with probability ``P``.
* ``extrinsic:DEG``: every camera's ``lidar2cam`` (and ``lidar2img``) rotated by ``DEG`` degrees about a random
  axis per view; the images stay, so the model projects with a calibration that no longer matches them.
* ``mixed:DEG``: a random azimuth ``a`` per sample; the LiDAR points within ``DEG / 2`` of ``a`` are removed and
  the cameras whose axis points within ``DEG / 2`` of ``a + 180`` are black (``DEG <= 180``: the sectors never
  overlap): no single modality is good everywhere.

Randomness is seeded per sample from ``seed`` and the sample token, so an evaluation is reproducible and
independent of the order in which samples are loaded.
"""
import numbers
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmdet.datasets.builder import PIPELINES

from ..box_geometry import points_in_boxes
from ..corruption_geometry import (axis_angle_rotation, beam_indices, boxes_at_time_lag, camera_forward_yaw,
                                   enlarged_boxes, fov_mask, kept_beams, points_in_sweep_frames)

#: results / img_metas key describing the applied corruption (add it to Collect3D's meta_keys).
CORRUPTION_KEY = 'corruption'
#: Beams and elevation limits (degrees) of the nuScenes LiDAR, a Velodyne HDL-32E (uniformly spaced beams).
HDL32E_BEAMS = 32
HDL32E_ELEVATION_RANGE_DEG = (-30.67, 10.67)

Argument = Union[int, float, None]


@dataclass(frozen=True)
class CorruptionMode:
    """A corruption mode: the inputs it changes and its argument.

    Args:
        input_keys: the ``results`` keys it needs: ``('points',)``,
            ``('img',)`` (the camera images and calibration) or both.
        arg_name: the ``SensorCorruption`` argument holding the mode's value
            (``None``: the mode takes none).
        arg_type: ``int`` or ``float``.
        is_valid: whether a value of ``arg_type`` is allowed.
        arg_help: what the value must be, for error messages.
        placeholder: the value's name in the CLI form ``mode:PLACEHOLDER``.
    """

    input_keys: Tuple[str, ...]
    arg_name: Optional[str] = None
    arg_type: type = float
    is_valid: Optional[Callable[[float], bool]] = None
    arg_help: str = ''
    placeholder: str = ''


_PROBABILITY = dict(arg_type=float, is_valid=lambda v: 0 <= v <= 1, arg_help='a probability in [0, 1]',
                    placeholder='P')
CORRUPTION_MODES: Dict[str, CorruptionMode] = {
    'lidar_drop': CorruptionMode(('points', )),
    'camera_drop': CorruptionMode(('img', )),
    'view_drop': CorruptionMode(('img', ), 'view', int, lambda v: v >= 0, 'a camera view index >= 0', 'N'),
    'fov': CorruptionMode(('points', ), 'fov_deg', float, lambda v: 0 < v <= 360, 'an angle in (0, 360] degrees',
                          'DEG'),
    'beams': CorruptionMode(('points', ), 'keep_beams', int, lambda v: v >= 1, 'a number of beams >= 1', 'K'),
    'points': CorruptionMode(('points', ), 'keep_ratio', float, lambda v: 0 < v <= 1, 'a fraction in (0, 1]', 'R'),
    'object_drop': CorruptionMode(('points', ), 'drop_prob', **_PROBABILITY),
    'camera_fail': CorruptionMode(('img', ), 'fail_prob', **_PROBABILITY),
    'extrinsic': CorruptionMode(('img', ), 'rotation_deg', float, lambda v: 0 < v <= 90,
                                'an angle in (0, 90] degrees', 'DEG'),
    'mixed': CorruptionMode(('points', 'img'), 'sector_deg', float, lambda v: 0 < v <= 180,
                            'a sector width in (0, 180] degrees', 'DEG'),
}
#: The CLI forms, for help texts: ``lidar_drop|camera_drop|view_drop:N|fov:DEG|...|mixed:DEG``.
CORRUPTION_FORMS = '|'.join(f'{mode}:{spec.placeholder}' if spec.arg_name else mode
                            for mode, spec in CORRUPTION_MODES.items())


def corruption_mode(mode: str) -> CorruptionMode:
    """The :class:`CorruptionMode` of ``mode``; ``ValueError`` naming the known forms if there is none."""
    if mode not in CORRUPTION_MODES:
        raise ValueError(f'unknown corruption mode {mode!r}; expected one of {CORRUPTION_FORMS}')
    return CORRUPTION_MODES[mode]


def check_corruption_argument(mode: str, value: Argument) -> Argument:
    """``value`` as the argument of ``mode`` (converted to its type), or ``ValueError`` saying what is wrong."""
    spec = corruption_mode(mode)
    if spec.arg_name is None:
        if value is not None:
            raise ValueError(f'corruption {mode!r} takes no argument, got {value!r}')
        return None
    if value is None:
        raise ValueError(f'corruption {mode!r} needs {spec.arg_name}: {spec.arg_help} '
                         f'(CLI form {mode}:{spec.placeholder})')
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if (not is_number or (spec.arg_type is int and not float(value).is_integer())
            or not spec.is_valid(spec.arg_type(value))):
        raise ValueError(f'corruption {mode!r}: {spec.arg_name} must be {spec.arg_help}, got {value!r}')
    return spec.arg_type(value)


def corruption_name(mode: str, value: Argument = None) -> str:
    """The CLI form of a corruption, e.g. ``'fov:120'``, ``'points:0.1'``, ``'lidar_drop'``."""
    return mode if value is None else f'{mode}:{np.format_float_positional(value, trim="-")}'


def parse_corruption(spec: str) -> Dict:
    """The ``SensorCorruption`` config of a CLI corruption ``mode[:arg]``.

    ``parse_corruption('view_drop:2') == dict(type='SensorCorruption', mode='view_drop', view=2)``.

    Raises:
        ValueError: unknown mode, a missing, unexpected or malformed
            argument, or an argument out of range.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f'a corruption must be a string {CORRUPTION_FORMS}, got {spec!r}')
    mode, has_arg, text = spec.strip().partition(':')
    mode_spec = corruption_mode(mode)
    value = None
    if has_arg:
        if mode_spec.arg_name is None:
            raise ValueError(f'corruption {mode!r} takes no argument, got {spec!r}')
        try:
            value = mode_spec.arg_type(text)
        except ValueError:
            raise ValueError(f'corruption {spec!r}: {text!r} is not {mode_spec.arg_help}') from None
    value = check_corruption_argument(mode, value)
    config = dict(type='SensorCorruption', mode=mode)
    if mode_spec.arg_name is not None:
        config[mode_spec.arg_name] = value
    return config


def sample_rng(seed: int, sample_key: str) -> np.random.Generator:
    """Random generator of one sample: a function of ``seed`` and the sample's token only."""
    return np.random.default_rng([int(seed), zlib.crc32(str(sample_key).encode())])


@PIPELINES.register_module()
class SensorCorruption:
    """Corrupt the LiDAR points or the camera images of a test sample (see the module docstring for the modes).

    Put it right after the loading steps (``LoadPointsFromFile``,
    ``LoadPointsFromMultiSweeps``, ``LoadMultiViewImageFromFiles``) and
    before any image resizing, normalisation or 3D augmentation:
    ``datasets.corruption_config.insert_corruption`` does so. Black then
    means pixels of value 0, which normalisation turns into ``-mean / std``.
    Sets ``results['corruption']``: ``name`` (CLI form), ``mode``, the
    argument, and per mode ``camera`` / ``views`` (the black views),
    ``forward_yaw_deg`` (``fov``), ``kept_beams`` (``beams``), ``seed`` (random
    modes), ``dropped_objects`` / ``num_objects`` (``object_drop``),
    ``rotation_axes`` (``extrinsic``: per view, in its camera frame),
    ``lidar_sector_deg`` / ``camera_sector_deg`` (``mixed``: the sector
    centres, as yaws in the LiDAR frame), ``num_points_before`` /
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
        rotation_deg (float, optional): ``extrinsic``: rotation of every camera's extrinsics, in degrees.
        sector_deg (float, optional): ``mixed``: width of the LiDAR sector and of the camera sector lost.
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
                 object_margin: float = 0.25, seed: int = 0,
                 forward_camera: str = 'CAM_FRONT', forward_yaw_deg: Optional[float] = None,
                 lidar_beams: int = HDL32E_BEAMS,
                 elevation_range_deg: Tuple[float, float] = HDL32E_ELEVATION_RANGE_DEG,
                 sweep_time_column: Optional[int] = None, inputs: Optional[Sequence[str]] = None) -> None:
        spec = corruption_mode(mode)
        if inputs is not None and not set(inputs) <= set(spec.input_keys):
            raise ValueError(f'SensorCorruption: mode {mode!r} corrupts {list(spec.input_keys)}, not {list(inputs)}')
        arguments = dict(view=view, fov_deg=fov_deg, keep_beams=keep_beams, keep_ratio=keep_ratio,
                         drop_prob=drop_prob, fail_prob=fail_prob, rotation_deg=rotation_deg, sector_deg=sector_deg)
        foreign = [name for name, value in arguments.items() if value is not None and name != spec.arg_name]
        if foreign:
            raise ValueError(f'SensorCorruption: {foreign} are not arguments of mode {mode!r}')
        if object_margin < 0:
            raise ValueError(f'SensorCorruption: object_margin must be >= 0, got {object_margin}')
        self.mode = mode
        self.input_keys = tuple(key for key in spec.input_keys if inputs is None or key in inputs)
        self.unread_inputs = tuple(key for key in spec.input_keys if key not in self.input_keys)
        self.arg_name = spec.arg_name
        self.value = check_corruption_argument(mode, arguments.get(spec.arg_name))
        self.name = corruption_name(mode, self.value)
        if mode == 'beams' and not (self.value <= lidar_beams and lidar_beams >= 2
                                    and elevation_range_deg[0] < elevation_range_deg[1]):
            raise ValueError(f'SensorCorruption({self.name}): cannot keep {self.value} beams of a LiDAR with '
                             f'lidar_beams={lidar_beams}, elevation_range_deg={elevation_range_deg}')
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
        record = dict(name=self.name, mode=self.mode)
        if self.arg_name is not None:
            record[self.arg_name] = self.value
        if self.mode in ('points', 'object_drop', 'camera_fail', 'extrinsic', 'mixed'):
            record['seed'] = self.seed
        if self.unread_inputs:
            record['unread_inputs'] = list(self.unread_inputs)
        if self.mode == 'mixed':
            lidar_yaw = self._rng(results).uniform(-np.pi, np.pi)
            record['lidar_sector_deg'] = float(np.degrees(lidar_yaw))
            record['camera_sector_deg'] = float(np.degrees(np.remainder(lidar_yaw + 2 * np.pi, 2 * np.pi) - np.pi))
        if self.mode == 'extrinsic' and 'img' in self.input_keys:
            self._misalign_cameras(results, record)
        elif 'img' in self.input_keys:
            self._black_out_views(results, record)
        if 'points' in self.input_keys:
            self._filter_points(results, record)
        results[CORRUPTION_KEY] = record
        return results

    def _rng(self, results: Dict) -> np.random.Generator:
        """The sample's random generator (a fresh one each call, so every draw is a function of the sample)."""
        if 'sample_idx' not in results:
            raise KeyError(f'SensorCorruption({self.name}) needs results["sample_idx"] (the sample token) to seed '
                           f'the sample\'s random draw')
        return sample_rng(self.seed, results['sample_idx'])

    def _black_out_views(self, results: Dict, record: Dict) -> None:
        images = results['img']
        if not isinstance(images, (list, tuple)):
            raise TypeError(f'SensorCorruption({self.name}) needs results["img"] as a list of per-view images '
                            f'(LoadMultiViewImageFromFiles), got {type(images).__name__}')
        views = self._failed_views(results, len(images), record)
        record['views'] = views
        results['img'] = [np.zeros_like(img) if view in views else img for view, img in enumerate(images)]

    def _failed_views(self, results: Dict, num_views: int, record: Dict) -> List[int]:
        """The camera views made black."""
        if self.mode == 'view_drop':
            if self.value >= num_views:
                raise ValueError(f'SensorCorruption({self.name}): the sample has {num_views} camera views '
                                 f'(0..{num_views - 1})')
            names = results.get('camera_names')
            record['camera'] = names[self.value] if names is not None else None
            return [self.value]
        if self.mode == 'camera_fail':
            return np.flatnonzero(self._rng(results).random(num_views) < self.value).tolist()
        if self.mode == 'mixed':
            if 'lidar2cam' not in results or len(results['lidar2cam']) != num_views:
                raise KeyError(f'SensorCorruption({self.name}) needs the calibration of every camera '
                               f'(results["lidar2cam"], one per view) to find the cameras of the failed sector')
            yaws = np.array([camera_forward_yaw(lidar2cam) for lidar2cam in results['lidar2cam']])
            facing = fov_mask(np.stack([np.cos(yaws), np.sin(yaws)], 1), np.deg2rad(record['camera_sector_deg']),
                              self.value)
            return np.flatnonzero(facing).tolist()
        return list(range(num_views))

    def _misalign_cameras(self, results: Dict, record: Dict) -> None:
        """Rotate every ``lidar2cam`` by ``rotation_deg`` about a random axis; recompose ``lidar2img``, in place."""
        missing = [key for key in ('lidar2cam', 'cam_intrinsic', 'lidar2img') if key not in results]
        if missing:
            raise KeyError(f'SensorCorruption({self.name}) needs the camera calibration results{missing} '
                           f'(CustomNuScenesDataset with use_camera=True provides it)')
        rng = self._rng(results)
        axes = []
        for view, (lidar2cam, intrinsic) in enumerate(zip(results['lidar2cam'], results['cam_intrinsic'])):
            axis = rng.normal(size=3)
            axis /= np.linalg.norm(axis)
            rotation = np.eye(4)
            rotation[:3, :3] = axis_angle_rotation(axis, self.value)
            misaligned = rotation @ np.asarray(lidar2cam, dtype=np.float64)
            # in place: the lists' arrays are shared with the 'extrinsics' / 'intrinsics' aliases
            lidar2cam[...] = misaligned
            results['lidar2img'][view][...] = np.asarray(intrinsic, dtype=np.float64) @ misaligned
            axes.append(axis.tolist())
        record['rotation_axes'] = axes

    def _filter_points(self, results: Dict, record: Dict) -> None:
        points = results['points']
        keep = self._kept_points(results, points.tensor.numpy(), record)
        record.update(num_points_before=int(len(keep)), num_points_after=int(keep.sum()))
        results['points'] = points[torch.from_numpy(keep)]

    def _kept_points(self, results: Dict, points: np.ndarray, record: Dict) -> np.ndarray:
        """``[N]`` bool mask of the points kept, for ``points`` ``[N, C]`` (xyz first)."""
        if self.mode == 'lidar_drop':
            return np.zeros(len(points), dtype=bool)
        if self.mode == 'fov':
            forward_yaw = self._forward_yaw(results)
            record['forward_yaw_deg'] = float(np.degrees(forward_yaw))
            return fov_mask(points[:, :2], forward_yaw, self.value)
        if self.mode == 'mixed':
            return ~fov_mask(points[:, :2], np.deg2rad(record['lidar_sector_deg']), self.value)
        if self.mode == 'beams':
            xyz = points[:, :3]
            if self.sweep_time_column is not None:
                xyz = points_in_sweep_frames(xyz, points[:, self.sweep_time_column], results['sweeps'],
                                             results['timestamp'])
            kept = kept_beams(self.lidar_beams, self.value)
            record['kept_beams'] = kept.tolist()
            return np.isin(beam_indices(xyz, self.lidar_beams, self.elevation_range_deg), kept)
        if self.mode == 'object_drop':
            return self._points_outside_dropped_objects(results, points, record)
        keep = np.zeros(len(points), dtype=bool)
        num_kept = int(round(self.value * len(points)))
        keep[self._rng(results).choice(len(points), num_kept, replace=False)] = True
        return keep

    def _points_outside_dropped_objects(self, results: Dict, points: np.ndarray, record: Dict) -> np.ndarray:
        boxes = results.get('ann_info', {}).get('gt_bboxes_3d')
        if boxes is None:
            raise KeyError(f'SensorCorruption({self.name}) needs the ground-truth boxes at test time '
                           f'(results["ann_info"]["gt_bboxes_3d"]); CustomNuScenesDataset provides them when the '
                           f'info file has annotations (not for the nuScenes test split)')
        boxes = boxes.tensor.numpy() if hasattr(boxes, 'tensor') else np.asarray(boxes)
        dropped = np.flatnonzero(self._rng(results).random(len(boxes)) < self.value)
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
        argument = '' if self.arg_name is None else f'{self.arg_name}={self.value}, '
        return (f'{self.__class__.__name__}(mode={self.mode!r}, {argument}seed={self.seed}, '
                f'forward_camera={self.forward_camera!r}, forward_yaw_deg={self.forward_yaw_deg}, '
                f'lidar_beams={self.lidar_beams}, elevation_range_deg={self.elevation_range_deg}, '
                f'sweep_time_column={self.sweep_time_column})')
