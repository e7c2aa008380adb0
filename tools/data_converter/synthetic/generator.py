"""Write a synthetic dataset in the nuScenes v1.0 on-disk format.

Layout written under ``root``::

    <version>/{attribute,calibrated_sensor,category,ego_pose,instance,log,map,sample,
               sample_annotation,sample_data,scene,sensor,visibility}.json
    samples/LIDAR_TOP/*.pcd.bin     key-frame point clouds, float32 [N, 5] (x, y, z, intensity, ring)
    sweeps/LIDAR_TOP/*.pcd.bin      intermediate LiDAR sweeps (20 Hz before each key frame)
    samples/CAM_*/*.jpg             the 6 camera images of every key frame
    maps/<token>.png                a stub semantic-prior map mask

Scene names come from the devkit's official split lists, so ``create_splits_scenes()``,
``DetectionEval`` and the info converter treat the synthetic scenes like real ones.
"""
import hashlib
import json
import os
import os.path as osp
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import cv2
import numpy as np

from ..transforms import matrix_to_quaternion, pose_matrix, yaw_to_quaternion
from .camera import CAMERA_MOUNTS, box_corners, camera_intrinsic, camera_to_ego_rotation, render_image
from .layout import CLASS_SPECS, EgoPath, SceneObject, sample_ego_path, sample_scene_objects
from .lidar import BoxSet, cast_scan, ray_directions
from .shape import FRONT_FACE_BGR, object_parts

#: Changes whenever the same options generate different data (2: objects with a visible heading, shape.py;
#: 3: a checkerboard ground and contact shadows in the images, camera.py), so that tools which cache a
#: generated set (tools/demo.py) regenerate it.
GENERATOR_VERSION = 3

TABLE_NAMES = ('attribute', 'calibrated_sensor', 'category', 'ego_pose', 'instance', 'log', 'map', 'sample',
               'sample_annotation', 'sample_data', 'scene', 'sensor', 'visibility')

# The 23 nuScenes categories (v1.0).
CATEGORIES = (
    'human.pedestrian.adult', 'human.pedestrian.child', 'human.pedestrian.wheelchair',
    'human.pedestrian.stroller', 'human.pedestrian.personal_mobility', 'human.pedestrian.police_officer',
    'human.pedestrian.construction_worker', 'animal', 'vehicle.car', 'vehicle.motorcycle', 'vehicle.bicycle',
    'vehicle.bus.bendy', 'vehicle.bus.rigid', 'vehicle.truck', 'vehicle.construction',
    'vehicle.emergency.ambulance', 'vehicle.emergency.police', 'vehicle.trailer', 'movable_object.barrier',
    'movable_object.trafficcone', 'movable_object.pushable_pullable', 'movable_object.debris',
    'static_object.bicycle_rack')

ATTRIBUTES = ('vehicle.moving', 'vehicle.stopped', 'vehicle.parked', 'cycle.with_rider', 'cycle.without_rider',
              'pedestrian.sitting_lying_down', 'pedestrian.standing', 'pedestrian.moving')

# nuScenes visibility bins: token -> level (fraction of the object visible).
VISIBILITY_LEVELS = (('1', 'v0-40', 0.4), ('2', 'v40-60', 0.6), ('3', 'v60-80', 0.8), ('4', 'v80-100', 1.01))

LIDAR_CHANNEL = 'LIDAR_TOP'
# nuScenes-like LiDAR mounting: 1.84 m above the ground, x to the right, y forward.
LIDAR_TRANSLATION = (0.985, 0.0, 1.84)
LIDAR_YAW = -np.pi / 2
LIDAR_MAX_RANGE = 70.0
KEYFRAME_INTERVAL_S = 0.5
SWEEP_INTERVAL_S = 0.05
LOCATIONS = ('singapore-onenorth', 'boston-seaport', 'singapore-queenstown', 'singapore-hollandvillage')


@dataclass(frozen=True)
class SyntheticConfig:
    """What to generate.

    Args:
        root: output data root.
        version: ``'v1.0-mini'`` or ``'v1.0-trainval'`` (decides the scene names / splits).
        num_scenes: total number of scenes.
        num_val_scenes: how many of them are validation scenes.
        samples_per_scene: key frames per scene (2 Hz).
        sweeps_per_sample: LiDAR sweeps before each key frame (20 Hz), at most 9.
        seed: random seed; the output is a deterministic function of the config.
        image_size: (width, height) of the camera images.
        objects_per_scene: objects per scene (the first 10 cover every class once).
        lidar_beams: LiDAR rings.
        lidar_azimuths: rays per ring.
        object_range: bound on |x| and |y| of object centres in the ego frame at every
            frame, in metres (48 fills a +-51.2 m detection range; a smaller demo range
            needs a smaller bound).
        front_intensity_offset: LiDAR intensity added to every object's front part (``shape.py``; 0: none).
    """

    root: str
    version: str = 'v1.0-mini'
    num_scenes: int = 10
    num_val_scenes: int = 2
    samples_per_scene: int = 10
    sweeps_per_sample: int = 3
    seed: int = 0
    image_size: Tuple[int, int] = (800, 450)
    objects_per_scene: int = 16
    lidar_beams: int = 32
    lidar_azimuths: int = 720
    object_range: float = 48.0
    front_intensity_offset: float = 0.0


#: Generator settings by preset name (``tools/make_synthetic_nuscenes.py --preset``): ``nuscenes-mini`` is shaped
#: like the nuScenes v1.0-mini split as the published configs read it: the 10 official mini scene names (the tool
#: makes 2 of them validation scenes), 1600 x 900 images, a 32-beam LiDAR at 1440 rays per ring (about 34 000 points per revolution, the
#: HDL-32E's density in nuScenes) and 9 sweeps before each key frame (10 per sample), at 10 key frames per scene.
PRESETS: Dict[str, Dict[str, object]] = {
    'nuscenes-mini': dict(version='v1.0-mini', num_scenes=10, samples_per_scene=10,
                          sweeps_per_sample=9, image_size=(1600, 900), objects_per_scene=24, lidar_beams=32,
                          lidar_azimuths=1440, object_range=48.0),
}


def split_scene_names(version: str, num_scenes: int, num_val_scenes: int) -> List[Tuple[str, str]]:
    """Official nuScenes scene names for the synthetic scenes, with their split.

    Args:
        version: ``'v1.0-mini'`` (names from ``mini_train`` / ``mini_val``) or
            ``'v1.0-trainval'`` (names from ``train`` / ``val``).
        num_scenes: total scenes.
        num_val_scenes: validation scenes among them.

    Returns:
        list[tuple[str, str]]: ``(scene name, 'train' | 'val')``, train scenes first.
    """
    from nuscenes.utils import splits
    lists = {'v1.0-mini': (splits.mini_train, splits.mini_val), 'v1.0-trainval': (splits.train, splits.val)}
    if version not in lists:
        raise ValueError(f'version must be one of {sorted(lists)}, got {version!r}')
    num_train = num_scenes - num_val_scenes
    if num_train < 0 or num_val_scenes < 0:
        raise ValueError(f'need 0 <= num_val_scenes <= num_scenes, got {num_val_scenes} of {num_scenes}')
    train_names, val_names = lists[version]
    if num_train > len(train_names) or num_val_scenes > len(val_names):
        raise ValueError(f'{version} has {len(train_names)} train and {len(val_names)} val scene names; asked for '
                         f'{num_train} train and {num_val_scenes} val scenes (use v1.0-trainval for more)')
    return [(n, 'train') for n in train_names[:num_train]] + [(n, 'val') for n in val_names[:num_val_scenes]]


def make_token(*parts: object) -> str:
    """Deterministic 32-hex-digit token (the nuScenes token format) from the given parts."""
    return hashlib.md5('/'.join(str(p) for p in parts).encode()).hexdigest()


def visibility_token(fraction: float) -> str:
    """nuScenes visibility token of an object of which ``fraction`` is visible."""
    for token, _, upper in VISIBILITY_LEVELS:
        if fraction < upper:
            return token
    return VISIBILITY_LEVELS[-1][0]


def _static_tables(seed: int) -> Dict[str, list]:
    """Tables that do not depend on the scenes: category, attribute, visibility, sensor."""
    return {
        'category': [dict(token=make_token(seed, 'category', n), name=n, description=f'nuScenes category {n}')
                     for n in CATEGORIES],
        'attribute': [dict(token=make_token(seed, 'attribute', n), name=n, description=f'nuScenes attribute {n}')
                      for n in ATTRIBUTES],
        'visibility': [dict(token=t, level=level, description=f'visibility of whole object is {level}')
                       for t, level, _ in VISIBILITY_LEVELS],
        'sensor': [dict(token=make_token(seed, 'sensor', LIDAR_CHANNEL), channel=LIDAR_CHANNEL, modality='lidar')] +
                  [dict(token=make_token(seed, 'sensor', c), channel=c, modality='camera') for c in CAMERA_MOUNTS],
    }


class _Chain:
    """Links records of one sequence (a sensor channel, an instance) through ``prev`` / ``next``."""

    def __init__(self) -> None:
        self.last: Dict[str, dict] = {}

    def append(self, key: str, record: dict) -> None:
        prev = self.last.get(key)
        record['prev'] = prev['token'] if prev else ''
        record['next'] = ''
        if prev:
            prev['next'] = record['token']
        self.last[key] = record


def _to_us(t: float) -> int:
    return int(round(t * 1e6))


class _SceneWriter:
    """Generates one scene: poses, LiDAR files, images and all table records."""

    def __init__(self, config: SyntheticConfig, tables: Dict[str, list], scene_index: int, scene_name: str,
                 log_token: str) -> None:
        self.cfg = config
        self.tables = tables
        self.index = scene_index
        self.name = scene_name
        self.log_token = log_token
        self.logfile = f'n008-2018-08-{1 + scene_index % 28:02d}-synthetic-{scene_name}'
        self.rng = np.random.default_rng([config.seed, scene_index])
        self.sensor_tokens = {r['channel']: r['token'] for r in tables['sensor']}
        self.category_tokens = {r['name']: r['token'] for r in tables['category']}
        self.attribute_tokens = {r['name']: r['token'] for r in tables['attribute']}
        self.channel_chain = _Chain()
        self.instance_chain = _Chain()
        self.width, self.height = config.image_size
        self.ray_dirs, self.ray_ring = ray_directions(config.lidar_beams, config.lidar_azimuths)

    def _token(self, *parts: object) -> str:
        return make_token(self.cfg.seed, self.name, *parts)

    def _calibrate(self) -> Dict[str, dict]:
        """One calibrated_sensor record per channel; returns them by channel."""
        calib = {LIDAR_CHANNEL: dict(token=self._token('calib', LIDAR_CHANNEL),
                                     sensor_token=self.sensor_tokens[LIDAR_CHANNEL],
                                     translation=list(LIDAR_TRANSLATION), rotation=yaw_to_quaternion(LIDAR_YAW),
                                     camera_intrinsic=[])}
        for channel, mount in CAMERA_MOUNTS.items():
            calib[channel] = dict(token=self._token('calib', channel), sensor_token=self.sensor_tokens[channel],
                                  translation=list(mount.translation),
                                  rotation=matrix_to_quaternion(camera_to_ego_rotation(mount.yaw_deg)),
                                  camera_intrinsic=camera_intrinsic(mount, self.width, self.height).tolist())
        self.tables['calibrated_sensor'].extend(calib.values())
        return calib

    def _ego_pose(self, ego: EgoPath, t: float, channel: str) -> dict:
        xy, yaw = ego.pose(t)
        record = dict(token=self._token('ego_pose', channel, _to_us(t)), timestamp=_to_us(t),
                      rotation=yaw_to_quaternion(yaw), translation=[float(v) for v in xy])
        self.tables['ego_pose'].append(record)
        return record

    def _sample_data(self, sample_token: str, channel: str, calib: dict, pose: dict, t: float, key: bool,
                     filename: str, fileformat: str, size: Tuple[int, int]) -> dict:
        record = dict(token=self._token('sample_data', channel, _to_us(t)), sample_token=sample_token,
                      ego_pose_token=pose['token'], calibrated_sensor_token=calib['token'], timestamp=_to_us(t),
                      fileformat=fileformat, is_key_frame=key, height=size[1], width=size[0], filename=filename)
        self.channel_chain.append(channel, record)
        self.tables['sample_data'].append(record)
        return record

    def _boxes_at(self, objects: List[SceneObject], t: float) -> BoxSet:
        return BoxSet(centers=np.array([o.center(t) for o in objects]).reshape(-1, 3),
                      lwh=np.array([[o.wlh[1], o.wlh[0], o.wlh[2]] for o in objects]).reshape(-1, 3),
                      yaws=np.array([o.yaw for o in objects]),
                      intensities=np.array([CLASS_SPECS[o.class_name].intensity for o in objects]))

    def _lidar_frame(self, ego: EgoPath, objects: List[SceneObject], calib: dict, sample_token: str, t: float,
                     key: bool):
        """Cast one LiDAR revolution, write its file and records; returns the scan."""
        pose = self._ego_pose(ego, t, LIDAR_CHANNEL)
        lidar2global = pose_matrix(pose['translation'], pose['rotation']) @ pose_matrix(
            calib['translation'], calib['rotation'])
        parts, owner, _ = object_parts(self._boxes_at(objects, t), self.cfg.front_intensity_offset)
        scan = cast_scan(lidar2global[:3, 3], self.ray_dirs @ lidar2global[:3, :3].T, self.ray_ring, parts,
                         LIDAR_MAX_RANGE, self.rng, owner=owner)
        local = (scan.points - lidar2global[:3, 3]) @ lidar2global[:3, :3]
        cloud = np.concatenate([local, scan.intensity[:, None], scan.ring[:, None]], axis=1).astype(np.float32)
        folder = 'samples' if key else 'sweeps'
        filename = f'{folder}/{LIDAR_CHANNEL}/{self.logfile}__{LIDAR_CHANNEL}__{_to_us(t)}.pcd.bin'
        cloud.tofile(osp.join(self.cfg.root, filename))
        self._sample_data(sample_token, LIDAR_CHANNEL, calib, pose, t, key, filename, 'pcd', (0, 0))
        return scan

    def _camera_frames(self, ego: EgoPath, objects: List[SceneObject], calibs: Dict[str, dict], sample_token: str,
                       t: float) -> None:
        parts, owner, is_front = object_parts(self._boxes_at(objects, t))
        corners = [box_corners(parts.centers[i], parts.lwh[i], parts.yaws[i]) for i in range(len(parts))]
        colours = [CLASS_SPECS[objects[o].class_name].colour for o in owner]
        front_colours = [FRONT_FACE_BGR if front else None for front in is_front]
        for channel in CAMERA_MOUNTS:
            calib = calibs[channel]
            pose = self._ego_pose(ego, t, channel)
            cam2global = pose_matrix(pose['translation'], pose['rotation']) @ pose_matrix(
                calib['translation'], calib['rotation'])
            image = render_image(np.array(calib['camera_intrinsic']), np.linalg.inv(cam2global), corners, colours,
                                 self.width, self.height, front_colours)
            filename = f'samples/{channel}/{self.logfile}__{channel}__{_to_us(t)}.jpg'
            cv2.imwrite(osp.join(self.cfg.root, filename), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
            self._sample_data(sample_token, channel, calib, pose, t, True, filename, 'jpg',
                              (self.width, self.height))

    def _annotate(self, objects: List[SceneObject], instances: List[dict], sample_token: str, t: float,
                  scan) -> int:
        num_points = np.bincount(scan.box_index[scan.box_index >= 0], minlength=len(objects))
        for i, (obj, instance) in enumerate(zip(objects, instances)):
            unoccluded = scan.rays_unoccluded[i]
            fraction = scan.rays_on_box[i] / unoccluded if unoccluded > 0 else 0.0
            record = dict(token=self._token('annotation', i, sample_token), sample_token=sample_token,
                          instance_token=instance['token'], visibility_token=visibility_token(fraction),
                          attribute_tokens=[self.attribute_tokens[obj.attribute]] if obj.attribute else [],
                          translation=[float(v) for v in obj.center(t)], size=list(obj.wlh),
                          rotation=yaw_to_quaternion(obj.yaw), num_lidar_pts=int(num_points[i]), num_radar_pts=0)
            self.instance_chain.append(instance['token'], record)
            if not instance['first_annotation_token']:
                instance['first_annotation_token'] = record['token']
            instance['last_annotation_token'] = record['token']
            instance['nbr_annotations'] += 1
            self.tables['sample_annotation'].append(record)
        return len(objects)

    def write(self, t_start: float) -> Tuple[int, int]:
        """Generate the scene; returns (number of samples, number of annotations)."""
        cfg = self.cfg
        key_times = [t_start + KEYFRAME_INTERVAL_S * k for k in range(cfg.samples_per_scene)]
        sweep_times = [[t - SWEEP_INTERVAL_S * j for j in range(cfg.sweeps_per_sample, 0, -1)] for t in key_times]
        all_times = sorted([t for ts in sweep_times for t in ts] + key_times)
        ego = sample_ego_path(self.rng, all_times[0], tuple(self.rng.uniform(300.0, 2000.0, size=2)))
        objects = sample_scene_objects(self.rng, ego, all_times, cfg.objects_per_scene, max_abs_xy=cfg.object_range)
        calibs = self._calibrate()
        instances = [dict(token=self._token('instance', i), category_token=self.category_tokens[o.category],
                          nbr_annotations=0, first_annotation_token='', last_annotation_token='')
                     for i, o in enumerate(objects)]
        self.tables['instance'].extend(instances)

        scene_token = self._token('scene')
        samples = [dict(token=self._token('sample', k), timestamp=_to_us(t), scene_token=scene_token)
                   for k, t in enumerate(key_times)]
        sample_chain = _Chain()
        for sample in samples:
            sample_chain.append('sample', sample)
        self.tables['sample'].extend(samples)

        num_annotations = 0
        for sample, t_key, t_sweeps in zip(samples, key_times, sweep_times):
            for t in t_sweeps:
                self._lidar_frame(ego, objects, calibs[LIDAR_CHANNEL], sample['token'], t, key=False)
            scan = self._lidar_frame(ego, objects, calibs[LIDAR_CHANNEL], sample['token'], t_key, key=True)
            self._camera_frames(ego, objects, calibs, sample['token'], t_key)
            num_annotations += self._annotate(objects, instances, sample['token'], t_key, scan)

        self.tables['scene'].append(dict(token=scene_token, log_token=self.log_token, nbr_samples=len(samples),
                                         first_sample_token=samples[0]['token'],
                                         last_sample_token=samples[-1]['token'], name=self.name,
                                         description=f'synthetic scene {self.name}: {len(objects)} objects'))
        self.tables['log'].append(dict(token=self.log_token, logfile=self.logfile, vehicle='n008',
                                       date_captured=f'2018-08-{1 + self.index % 28:02d}',
                                       location=LOCATIONS[self.index % len(LOCATIONS)]))
        return len(samples), num_annotations


def generate_synthetic_nuscenes(config: SyntheticConfig,
                                log: Optional[Callable[[str], None]] = print) -> Dict[str, int]:
    """Write the whole dataset described by ``config``.

    Args:
        config: what to generate.
        log: progress printer (``None`` for silence).

    Returns:
        dict: counts ``scenes``, ``samples``, ``annotations``.
    """
    if config.samples_per_scene < 1:
        raise ValueError(f'samples_per_scene must be >= 1, got {config.samples_per_scene}')
    if not 0 <= config.sweeps_per_sample <= 9:
        raise ValueError(f'sweeps_per_sample must be in [0, 9] (20 Hz between 2 Hz key frames), '
                         f'got {config.sweeps_per_sample}')
    width, height = config.image_size
    if width < 16 or height < 16:
        raise ValueError(f'image_size must be at least 16x16, got {width}x{height}')
    names = split_scene_names(config.version, config.num_scenes, config.num_val_scenes)
    table_dir = osp.join(config.root, config.version)
    for folder in [table_dir, osp.join(config.root, 'maps'), osp.join(config.root, 'samples', LIDAR_CHANNEL),
                   osp.join(config.root, 'sweeps', LIDAR_CHANNEL)] + [
                       osp.join(config.root, 'samples', c) for c in CAMERA_MOUNTS]:
        os.makedirs(folder, exist_ok=True)

    tables: Dict[str, list] = {name: [] for name in TABLE_NAMES}
    tables.update(_static_tables(config.seed))
    totals = dict(scenes=0, samples=0, annotations=0)
    for index, (name, split) in enumerate(names):
        start = time.time()
        writer = _SceneWriter(config, tables, index, name, make_token(config.seed, 'log', name))
        num_samples, num_annotations = writer.write(t_start=1533151603.0 + 100.0 * index)
        totals['scenes'] += 1
        totals['samples'] += num_samples
        totals['annotations'] += num_annotations
        if log is not None:
            log(f'[{index + 1}/{len(names)}] {name} ({split}): {num_samples} samples, '
                f'{num_annotations} annotations, {time.time() - start:.1f}s')

    map_token = make_token(config.seed, 'map')
    map_file = f'maps/{map_token}.png'
    cv2.imwrite(osp.join(config.root, map_file), np.full((16, 16), 255, dtype=np.uint8))
    tables['map'] = [dict(token=map_token, category='semantic_prior', filename=map_file,
                          log_tokens=[r['token'] for r in tables['log']])]
    for name in TABLE_NAMES:
        with open(osp.join(table_dir, f'{name}.json'), 'w') as f:
            json.dump(tables[name], f, indent=0)
    return totals
