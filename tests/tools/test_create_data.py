"""tools/create_data.py nuscenes: info files in the mmdet3d / CMT format, the GT database and bad-input errors."""
import json
import os
import os.path as osp
import pickle

import cv2
import numpy as np
import pytest

from tools.create_data import main as create_data_main
from tools.data_converter.synthetic.generator import SyntheticConfig, generate_synthetic_nuscenes

VERSION = 'v1.0-mini'
INFO_KEYS = {'lidar_path', 'token', 'timestamp', 'sweeps', 'cams', 'lidar2ego_translation', 'lidar2ego_rotation',
             'ego2global_translation', 'ego2global_rotation', 'gt_boxes', 'gt_names', 'gt_velocity', 'num_lidar_pts',
             'num_radar_pts', 'valid_flag'}
CAMERA_KEYS = {'data_path', 'type', 'sample_data_token', 'sensor2ego_translation', 'sensor2ego_rotation',
               'ego2global_translation', 'ego2global_rotation', 'timestamp', 'sensor2lidar_rotation',
               'sensor2lidar_translation', 'cam_intrinsic'}


def generate(root: str, num_scenes: int = 2, samples: int = 2) -> str:
    generate_synthetic_nuscenes(SyntheticConfig(root=root, version=VERSION, num_scenes=num_scenes,
                                                num_val_scenes=num_scenes // 2, samples_per_scene=samples,
                                                sweeps_per_sample=2, seed=1, image_size=(256, 144),
                                                objects_per_scene=12, lidar_beams=32, lidar_azimuths=360), log=None)
    return root


def run_create_data(root: str, out_dir: str, *extra: str) -> None:
    import projects.mmdet3d_plugin  # noqa: F401
    create_data_main(['nuscenes', '--root-path', root, '--out-dir', out_dir, '--extra-tag', 'nuscenes', '--version',
                      VERSION, *extra])


def load(path: str):
    with open(path, 'rb') as f:
        return pickle.load(f)


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
    root = generate(str(tmp_path_factory.mktemp('synthetic')))
    out_dir = str(tmp_path_factory.mktemp('infos'))
    run_create_data(root, out_dir)
    return root, out_dir


def test_infos_have_the_mmdet3d_layout_and_split_by_scene(converted):
    root, out_dir = converted
    train, val = (load(osp.join(out_dir, f'nuscenes_infos_{s}.pkl')) for s in ('train', 'val'))
    assert train['metadata'] == {'version': VERSION} == val['metadata']
    assert len(train['infos']) == 2 and len(val['infos']) == 2
    assert not {i['token'] for i in train['infos']} & {i['token'] for i in val['infos']}
    for info in train['infos'] + val['infos']:
        assert INFO_KEYS <= set(info)
        assert list(info['cams']) == ['CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT',
                                      'CAM_BACK_RIGHT']
        assert all(CAMERA_KEYS <= set(cam) for cam in info['cams'].values())
        # Sweeps follow the LiDAR's prev links (through earlier key frames too), newest first.
        sweep_times = [info['timestamp']] + [s['timestamp'] for s in info['sweeps']]
        assert len(info['sweeps']) >= 2 and np.all(np.diff(sweep_times) < 0)
        assert all(osp.isfile(s['data_path']) for s in info['sweeps'])
        num = len(info['gt_names'])
        assert info['gt_boxes'].shape == (num, 7) and info['gt_velocity'].shape == (num, 2)


def test_info_boxes_contain_exactly_the_declared_lidar_points(converted):
    """Cross-checks the box convention (gravity centre, l/w/h order, yaw sign, LiDAR frame) against the raw data."""
    from projects.mmdet3d_plugin.datasets.box_geometry import points_in_boxes
    _, out_dir = converted
    for info in load(osp.join(out_dir, 'nuscenes_infos_train.pkl'))['infos']:
        points = np.fromfile(info['lidar_path'], dtype=np.float32).reshape(-1, 5)
        bottom_centre = info['gt_boxes'].copy()
        bottom_centre[:, 2] -= bottom_centre[:, 5] / 2
        assert points_in_boxes(points, bottom_centre).sum(axis=0).tolist() == info['num_lidar_pts'].tolist()


def test_gt_database_holds_each_objects_points_and_image_patches(converted):
    from projects.mmdet3d_plugin.datasets.box_geometry import points_in_boxes
    root, out_dir = converted
    db_infos = load(osp.join(out_dir, 'nuscenes_dbinfos_train.pkl'))
    train_tokens = {i['token'] for i in load(osp.join(out_dir, 'nuscenes_infos_train.pkl'))['infos']}
    records = [r for records in db_infos.values() for r in records]
    assert len(db_infos) >= 8 and len(records) >= 16
    with_patch = 0
    for name, class_records in db_infos.items():
        for record in class_records:
            assert record['name'] == name and record['image_idx'] in train_tokens
            points = np.fromfile(osp.join(out_dir, record['path']), dtype=np.float32).reshape(-1, 5)
            assert len(points) == record['num_points_in_gt'] > 0
            box = record['box3d_lidar'][None].astype(np.float64)
            assert points_in_boxes(points[:, :3] + box[0, :3], box).all()
            for camera, patch in record['image_patches'].items():
                image = cv2.imread(osp.join(out_dir, patch['path']))
                x1, y1, x2, y2 = patch['rect']
                assert image.shape[:2] == (y2 - y1, x2 - x1) and patch['depth'] > 0
            if record['image_patches']:
                with_patch += 1
                assert record['image_crop_key'] in record['image_patches']
                assert record['image_path'] == record['image_patches'][record['image_crop_key']]['path']
    assert with_patch >= 0.8 * len(records)


def test_progress_is_printed(tmp_path, capsys):
    root = generate(str(tmp_path / 'data'), num_scenes=2, samples=1)
    run_create_data(root, str(tmp_path / 'out'), '--no-gt-database')
    out = capsys.readouterr().out
    assert 'infos: 2/2 samples' in out and 'done in' in out
    assert not osp.exists(tmp_path / 'out' / 'nuscenes_dbinfos_train.pkl')


def test_missing_data_root_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='nuScenes data root not found.*nowhere'):
        run_create_data(str(tmp_path / 'nowhere'), str(tmp_path / 'out'))


def test_missing_version_tables_list_the_present_versions(tmp_path):
    root = generate(str(tmp_path / 'data'), num_scenes=2, samples=1)
    with pytest.raises(FileNotFoundError, match=r"v1.0-trainval.*present.*\['v1.0-mini'\]"):
        create_data_main(['nuscenes', '--root-path', root, '--version', 'v1.0-trainval'])


@pytest.mark.parametrize('what', ['sweeps/LIDAR_TOP', 'samples/LIDAR_TOP', 'samples/CAM_BACK'])
def test_missing_data_file_is_named(tmp_path, what):
    root = generate(str(tmp_path / 'data'), num_scenes=2, samples=1)
    victim = osp.join(root, what, sorted(os.listdir(osp.join(root, what)))[-1])
    os.remove(victim)
    with pytest.raises(FileNotFoundError, match=victim.replace('.', r'\.')):
        run_create_data(root, str(tmp_path / 'out'))


def test_gt_database_refuses_an_info_file_of_another_version(converted, tmp_path):
    from tools.data_converter.gt_database import create_groundtruth_database
    _, out_dir = converted
    with pytest.raises(ValueError, match=r'nuscenes_infos_train\.pkl was made from nuScenes v1.0-mini'):
        create_groundtruth_database(osp.join(out_dir, 'nuscenes_infos_train.pkl'), str(tmp_path),
                                    expected_version='v1.0-trainval', verbose=False)


def test_nuscenes_mini_preset_is_nuscenes_shaped_and_converts(tmp_path):
    """``--preset nuscenes-mini`` (two of its scenes, two key frames each): 1600 x 900 images, about 34 000 LiDAR
    points per revolution, 10 sweeps per sample in the infos, attributes and velocities, image patches in the GT
    database."""
    from tools.make_synthetic_nuscenes import main as make_synthetic_main
    root = str(tmp_path)
    make_synthetic_main(['--preset', 'nuscenes-mini', '--root', root, '--scenes', '2', '--samples', '2',
                                  '--quiet'])
    create_data_main(['nuscenes', '--root-path', root, '--version', 'v1.0-mini'])
    infos = load(osp.join(root, 'nuscenes_infos_train.pkl'))['infos']
    assert load(osp.join(root, 'nuscenes_infos_val.pkl'))['metadata']['version'] == 'v1.0-mini'
    info = infos[0]
    assert len(info['cams']) == 6 and len(info['sweeps']) == 9
    assert cv2.imread(info['cams']['CAM_FRONT']['data_path']).shape == (900, 1600, 3)
    for path in [info['lidar_path']] + [sweep['data_path'] for sweep in info['sweeps']]:
        assert 30000 < len(np.fromfile(path, dtype=np.float32)) // 5 < 38000
    assert np.nanmax(np.abs(info['gt_velocity'])) > 0.5
    with open(osp.join(root, 'v1.0-mini', 'sample_annotation.json')) as f:
        assert any(record['attribute_tokens'] for record in json.load(f))
    db_infos = load(osp.join(root, 'nuscenes_dbinfos_train.pkl'))
    assert any(record['image_patches'] for records in db_infos.values() for record in records)
