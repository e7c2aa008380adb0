"""nuScenes (real or synthetic) → info ``.pkl`` files in the upstream CMT / mmdet3d 1.0 format.

Only the nuScenes devkit API is used, so v1.0-trainval, v1.0-mini, v1.0-test and the
synthetic set (``tools/make_synthetic_nuscenes.py``) go through the same code.

Each info (one key frame) is a dict with::

    lidar_path, token, timestamp (µs), sweeps, cams,
    lidar2ego_translation, lidar2ego_rotation, ego2global_translation, ego2global_rotation,
    and, except for v1.0-test:
    gt_boxes [N, 7]      LiDAR frame (x, y, z, l, w, h, yaw): gravity centre, sizes along the box's
                         own x (length), y (width), z axes, yaw about +z from the LiDAR x axis
                         (mmdet3d >= 1.0 ``LiDARInstance3DBoxes`` convention, before ``origin`` shift)
    gt_names [N]         detection class name (devkit mapping) or the raw category name
    gt_velocity [N, 2]   LiDAR frame m/s (NaN when the devkit cannot estimate it)
    num_lidar_pts [N], num_radar_pts [N], valid_flag [N] (lidar + radar points > 0)

A sweep / camera entry has ``data_path, type, sample_data_token, sensor2ego_translation,
sensor2ego_rotation, ego2global_translation, ego2global_rotation, timestamp,
sensor2lidar_rotation [3, 3], sensor2lidar_translation [3]`` (``p_lidar = R @ p + T``),
cameras also ``cam_intrinsic [3, 3]``. The file holds ``dict(infos=[...], metadata=dict(version=...))``.
"""
import os
import os.path as osp
import pickle
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from .transforms import quaternion_to_matrix, sensor_to_lidar

CAMERA_TYPES: Tuple[str, ...] = ('CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT',
                                 'CAM_BACK_RIGHT')
SUPPORTED_VERSIONS: Tuple[str, ...] = ('v1.0-trainval', 'v1.0-test', 'v1.0-mini')
Pose = Tuple[Sequence[float], Sequence[float]]


def check_data_root(root_path: str, version: str) -> None:
    """Raise a clear error when the data root or its table folder is missing.

    Raises:
        FileNotFoundError: naming the missing folder (and the versions that do exist).
        ValueError: for an unsupported version.
    """
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f'unsupported nuScenes version {version!r}; expected one of {SUPPORTED_VERSIONS}')
    if not osp.isdir(root_path):
        raise FileNotFoundError(f'nuScenes data root not found: {root_path!r} (generate one with '
                                f'tools/make_synthetic_nuscenes.py or point --root-path at nuScenes)')
    table_dir = osp.join(root_path, version)
    if not osp.isdir(table_dir):
        present = sorted(v for v in SUPPORTED_VERSIONS if osp.isdir(osp.join(root_path, v)))
        raise FileNotFoundError(f'nuScenes tables for {version} not found: {table_dir!r} '
                                f'(versions present in {root_path!r}: {present or "none"})')


def require_file(path: str, what: str) -> str:
    """Return ``path`` if it is a file, else raise ``FileNotFoundError`` naming it and ``what`` it is."""
    if not osp.isfile(path):
        raise FileNotFoundError(f'missing {what}: {path}')
    return path


def report_progress(done: int, total: int, what: str, verbose: bool = True) -> None:
    """Print ``what: done/total`` about ten times over a run (and at its end)."""
    if verbose and (done == total or done % max(1, total // 10) == 0):
        print(f'  {what}: {done}/{total} samples', flush=True)


def split_scene_tokens(nusc, version: str) -> Tuple[Set[str], Set[str]]:
    """Tokens of the train and val scenes present in ``nusc`` (official devkit splits).

    For v1.0-test every scene is returned as "train" (the single output set) and val is empty.
    """
    from nuscenes.utils import splits
    names = {'v1.0-trainval': (splits.train, splits.val), 'v1.0-test': (splits.test, []),
             'v1.0-mini': (splits.mini_train, splits.mini_val)}[version]
    by_name = {scene['name']: scene['token'] for scene in nusc.scene}
    unknown = sorted(set(by_name) - set(names[0]) - set(names[1]))
    if unknown:
        raise ValueError(f'scenes {unknown[:5]} of {version} are in none of the devkit splits of that version '
                         f'(synthetic data must be generated with the same --version)')
    return ({by_name[n] for n in names[0] if n in by_name}, {by_name[n] for n in names[1] if n in by_name})


def sensor_info(nusc, sample_data_token: str, lidar2ego: Pose, ego2global: Pose, sensor_type: str) -> dict:
    """Info of one sensor reading (a sweep or a camera image) relative to the key-frame LiDAR.

    Args:
        nusc: a ``NuScenes`` instance.
        sample_data_token: the reading.
        lidar2ego: key-frame LiDAR calibration ``(translation, rotation)``.
        ego2global: key-frame ego pose ``(translation, rotation)``.
        sensor_type: ``'lidar'`` or the camera channel.

    Raises:
        FileNotFoundError: if the reading's file is missing.
    """
    sd_rec = nusc.get('sample_data', sample_data_token)
    calib = nusc.get('calibrated_sensor', sd_rec['calibrated_sensor_token'])
    pose = nusc.get('ego_pose', sd_rec['ego_pose_token'])
    what = 'LiDAR sweep file' if sensor_type == 'lidar' else f'{sensor_type} image'
    data_path = require_file(nusc.get_sample_data_path(sample_data_token), what)
    rotation, translation = sensor_to_lidar((calib['translation'], calib['rotation']),
                                            (pose['translation'], pose['rotation']), lidar2ego, ego2global)
    return dict(data_path=data_path, type=sensor_type, sample_data_token=sample_data_token,
                sensor2ego_translation=calib['translation'], sensor2ego_rotation=calib['rotation'],
                ego2global_translation=pose['translation'], ego2global_rotation=pose['rotation'],
                timestamp=sd_rec['timestamp'], sensor2lidar_rotation=rotation, sensor2lidar_translation=translation)


def lidar_sweeps(nusc, lidar_token: str, lidar2ego: Pose, ego2global: Pose, max_sweeps: int) -> List[dict]:
    """Up to ``max_sweeps`` previous LiDAR readings (newest first), following ``prev`` links."""
    sweeps = []
    sd_rec = nusc.get('sample_data', lidar_token)
    while len(sweeps) < max_sweeps and sd_rec['prev']:
        sweeps.append(sensor_info(nusc, sd_rec['prev'], lidar2ego, ego2global, 'lidar'))
        sd_rec = nusc.get('sample_data', sd_rec['prev'])
    return sweeps


def annotation_arrays(nusc, sample: dict, lidar2ego: Pose, ego2global: Pose) -> Dict[str, np.ndarray]:
    """Ground truth of one key frame in the LiDAR frame (see the module docstring for the layout)."""
    from nuscenes.eval.detection.utils import category_to_detection_name
    _, boxes, _ = nusc.get_sample_data(sample['data']['LIDAR_TOP'])
    annotations = [nusc.get('sample_annotation', token) for token in sample['anns']]
    if len(boxes) != len(annotations):
        raise ValueError(f'sample {sample["token"]}: {len(boxes)} boxes for {len(annotations)} annotations')
    centers = np.array([b.center for b in boxes], dtype=np.float64).reshape(-1, 3)
    wlh = np.array([b.wlh for b in boxes], dtype=np.float64).reshape(-1, 3)
    yaws = np.array([b.orientation.yaw_pitch_roll[0] for b in boxes], dtype=np.float64).reshape(-1, 1)
    global2lidar = (quaternion_to_matrix(ego2global[1]) @ quaternion_to_matrix(lidar2ego[1])).T
    velocity = np.array([global2lidar @ np.append(nusc.box_velocity(a['token'])[:2], 0.0)
                         for a in annotations], dtype=np.float64).reshape(-1, 3)[:, :2]
    names = [category_to_detection_name(b.name) or b.name for b in boxes]
    num_lidar = np.array([a['num_lidar_pts'] for a in annotations], dtype=np.int64)
    num_radar = np.array([a['num_radar_pts'] for a in annotations], dtype=np.int64)
    return dict(gt_boxes=np.concatenate([centers, wlh[:, [1, 0, 2]], yaws], axis=1),
                gt_names=np.array(names, dtype='<U40'), gt_velocity=velocity,
                num_lidar_pts=num_lidar, num_radar_pts=num_radar, valid_flag=(num_lidar + num_radar) > 0)


def sample_info(nusc, sample: dict, max_sweeps: int, with_annotations: bool) -> dict:
    """The info dict of one key frame (see the module docstring).

    Raises:
        FileNotFoundError: naming a missing LiDAR, sweep or camera file.
    """
    lidar_token = sample['data']['LIDAR_TOP']
    sd_rec = nusc.get('sample_data', lidar_token)
    calib = nusc.get('calibrated_sensor', sd_rec['calibrated_sensor_token'])
    pose = nusc.get('ego_pose', sd_rec['ego_pose_token'])
    lidar2ego = (calib['translation'], calib['rotation'])
    ego2global = (pose['translation'], pose['rotation'])
    info = dict(lidar_path=require_file(nusc.get_sample_data_path(lidar_token), 'LiDAR file'),
                token=sample['token'], timestamp=sample['timestamp'],
                lidar2ego_translation=calib['translation'], lidar2ego_rotation=calib['rotation'],
                ego2global_translation=pose['translation'], ego2global_rotation=pose['rotation'],
                sweeps=lidar_sweeps(nusc, lidar_token, lidar2ego, ego2global, max_sweeps), cams={})
    for cam in CAMERA_TYPES:
        if cam not in sample['data']:
            raise KeyError(f'sample {sample["token"]} has no {cam} image (expected all of {CAMERA_TYPES})')
        cam_token = sample['data'][cam]
        cam_info = sensor_info(nusc, cam_token, lidar2ego, ego2global, cam)
        calib_cam = nusc.get('calibrated_sensor', nusc.get('sample_data', cam_token)['calibrated_sensor_token'])
        cam_info['cam_intrinsic'] = np.array(calib_cam['camera_intrinsic'], dtype=np.float64)
        info['cams'][cam] = cam_info
    if with_annotations:
        info.update(annotation_arrays(nusc, sample, lidar2ego, ego2global))
    return info


def info_file_paths(out_dir: str, info_prefix: str, version: str) -> Dict[str, str]:
    """Where the info files of ``version`` go: ``{'train': ..., 'val': ...}`` or ``{'test': ...}``."""
    splits = ('test', ) if version == 'v1.0-test' else ('train', 'val')
    return {s: osp.join(out_dir, f'{info_prefix}_infos_{s}.pkl') for s in splits}


def create_nuscenes_infos(root_path: str, out_dir: str, info_prefix: str = 'nuscenes',
                          version: str = 'v1.0-trainval', max_sweeps: int = 10,
                          verbose: bool = True) -> Dict[str, str]:
    """Write the info files of one nuScenes version.

    Args:
        root_path: data root (holding ``<version>/``, ``samples/``, ``sweeps/``).
        out_dir: where the ``.pkl`` files go.
        info_prefix: file name prefix (``nuscenes`` → ``nuscenes_infos_train.pkl``).
        version: ``v1.0-trainval``, ``v1.0-mini`` or ``v1.0-test``.
        max_sweeps: LiDAR sweeps kept per key frame.
        verbose: print progress.

    Returns:
        dict: split name → written file path.
    """
    from nuscenes import NuScenes
    check_data_root(root_path, version)
    nusc = NuScenes(version=version, dataroot=root_path, verbose=verbose)
    train_scenes, val_scenes = split_scene_tokens(nusc, version)
    test = version == 'v1.0-test'
    infos: Dict[str, List[dict]] = {'test': []} if test else {'train': [], 'val': []}
    for index, sample in enumerate(nusc.sample):
        info = sample_info(nusc, sample, max_sweeps, with_annotations=not test)
        if test:
            infos['test'].append(info)
        elif sample['scene_token'] in train_scenes:
            infos['train'].append(info)
        elif sample['scene_token'] in val_scenes:
            infos['val'].append(info)
        report_progress(index + 1, len(nusc.sample), 'infos', verbose)
    os.makedirs(out_dir, exist_ok=True)
    paths = info_file_paths(out_dir, info_prefix, version)
    for split, path in paths.items():
        with open(path, 'wb') as f:
            pickle.dump(dict(infos=infos[split], metadata=dict(version=version)), f)
        if verbose:
            print(f'  {split}: {len(infos[split])} samples -> {path}')
    return paths


def load_infos(info_path: str, expected_version: Optional[str] = None) -> dict:
    """Load an info file and check it.

    Args:
        info_path: ``.pkl`` written by :func:`create_nuscenes_infos`.
        expected_version: when given, ``metadata.version`` must equal it.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: not an info file, or made from another nuScenes version.
    """
    require_file(info_path, 'info file')
    with open(info_path, 'rb') as f:
        data = pickle.load(f)
    if not isinstance(data, dict) or 'infos' not in data or 'version' not in data.get('metadata', {}):
        raise ValueError(f'{info_path} is not a nuScenes info file (expected a dict with "infos" and '
                         f'"metadata.version"; run tools/create_data.py nuscenes)')
    version = data['metadata']['version']
    if expected_version is not None and version != expected_version:
        raise ValueError(f'{info_path} was made from nuScenes {version}, but {expected_version} was expected '
                         f'(re-run tools/create_data.py nuscenes --version {expected_version})')
    return data
