"""The synthetic nuScenes generator: devkit-loadable tables, LiDAR points on the boxes, objects in the images."""
import filecmp
import os
import os.path as osp

import cv2
import numpy as np
import pytest

from tools.data_converter.synthetic.generator import TABLE_NAMES, SyntheticConfig, generate_synthetic_nuscenes
from tools.data_converter.synthetic.layout import CLASS_SPECS
from tools.make_synthetic_nuscenes import main as make_synthetic_main

VERSION = 'v1.0-mini'
CAMERAS = ('CAM_FRONT', 'CAM_FRONT_RIGHT', 'CAM_FRONT_LEFT', 'CAM_BACK', 'CAM_BACK_LEFT', 'CAM_BACK_RIGHT')
# Classes whose colour is not grey: a pixel of theirs cannot be mistaken for the sky or the ground.
COLOURED_CLASSES = [name for name, spec in CLASS_SPECS.items() if np.ptp(spec.colour) > 60]


def tiny_config(root: str, seed: int = 0) -> SyntheticConfig:
    return SyntheticConfig(root=root, version=VERSION, num_scenes=2, num_val_scenes=1, samples_per_scene=2,
                           sweeps_per_sample=2, seed=seed, image_size=(256, 144), objects_per_scene=14, lidar_beams=32,
                           lidar_azimuths=360)


def matches_colour(pixels_bgr: np.ndarray, colour_bgr) -> np.ndarray:
    """Whether pixels ``[N, 3]`` are a shade of ``colour_bgr`` (cosine similarity of the BGR vectors > 0.97)."""
    pixels = np.asarray(pixels_bgr, dtype=np.float64).reshape(-1, 3)
    colour = np.asarray(colour_bgr, dtype=np.float64)
    cosine = pixels @ colour / (np.linalg.norm(pixels, axis=1) * np.linalg.norm(colour) + 1e-9)
    return cosine > 0.97


@pytest.fixture(scope='module')
def nusc(tmp_path_factory):
    from nuscenes import NuScenes
    root = str(tmp_path_factory.mktemp('synthetic'))
    generate_synthetic_nuscenes(tiny_config(root), log=None)
    return NuScenes(version=VERSION, dataroot=root, verbose=False)


def test_tables_load_with_the_devkit_and_use_official_scene_names(nusc):
    from nuscenes.utils.splits import create_splits_scenes
    splits = create_splits_scenes()
    assert sorted(os.listdir(osp.join(nusc.dataroot, VERSION))) == sorted(f'{t}.json' for t in TABLE_NAMES)
    names = [scene['name'] for scene in nusc.scene]
    assert len(names) == 2 and names[0] in splits['mini_train'] and names[1] in splits['mini_val']
    assert len(nusc.sample) == 4
    assert len(nusc.sample_annotation) == sum(len(s['anns']) for s in nusc.sample) > 0


def test_every_sample_has_six_images_and_a_lidar_file_with_sweeps(nusc):
    for sample in nusc.sample:
        assert set(sample['data']) == set(CAMERAS) | {'LIDAR_TOP'}
        for camera in CAMERAS:
            image = cv2.imread(nusc.get_sample_data_path(sample['data'][camera]))
            assert image.shape == (144, 256, 3)
        lidar = nusc.get('sample_data', sample['data']['LIDAR_TOP'])
        points = np.fromfile(nusc.get_sample_data_path(lidar['token']), dtype=np.float32).reshape(-1, 5)
        assert len(points) > 1000
        sweep = nusc.get('sample_data', lidar['prev']) if lidar['prev'] else None
        assert sweep is not None and not sweep['is_key_frame'] and osp.isfile(nusc.get_sample_data_path(sweep['token']))


def test_lidar_points_lie_on_the_annotated_boxes_or_on_the_ground(nusc):
    from nuscenes.utils.geometry_utils import points_in_box
    from pyquaternion import Quaternion
    for sample in nusc.sample:
        lidar_token = sample['data']['LIDAR_TOP']
        path, boxes, _ = nusc.get_sample_data(lidar_token)
        points = np.fromfile(path, dtype=np.float32).reshape(-1, 5)[:, :3].T
        inside = np.stack([points_in_box(box, points) for box in boxes])  # [boxes, points]
        annotations = [nusc.get('sample_annotation', token) for token in sample['anns']]
        # The devkit's own point-in-box test counts exactly the points the annotations declare.
        assert inside.sum(axis=1).tolist() == [a['num_lidar_pts'] for a in annotations]
        assert (inside.sum(axis=0) <= 1).all()
        assert sum(a['num_lidar_pts'] > 0 for a in annotations) >= 0.8 * len(annotations)
        # Every other point is on the ground: global z within a few centimetres of 0.
        record = nusc.get('sample_data', lidar_token)
        calib = nusc.get('calibrated_sensor', record['calibrated_sensor_token'])
        pose = nusc.get('ego_pose', record['ego_pose_token'])
        ground = points[:, ~inside.any(axis=0)]
        ego = Quaternion(calib['rotation']).rotation_matrix @ ground + np.c_[calib['translation']]
        global_z = (Quaternion(pose['rotation']).rotation_matrix @ ego)[2] + pose['translation'][2]
        assert np.abs(global_z).max() < 0.05
        assert inside.any(axis=0).mean() > 0.05


def test_objects_appear_in_their_class_colour_where_their_boxes_project(nusc):
    from nuscenes.eval.detection.utils import category_to_detection_name
    from nuscenes.utils.geometry_utils import view_points
    matched = checked = 0
    for sample in nusc.sample:
        for camera in CAMERAS:
            path, boxes, intrinsic = nusc.get_sample_data(sample['data'][camera])
            image = cv2.imread(path)
            for box in boxes:
                name = category_to_detection_name(box.name)
                if name not in COLOURED_CLASSES or box.center[2] < 1.0:
                    continue
                u, v = view_points(box.center[:, None], np.asarray(intrinsic), normalize=True)[:2, 0]
                if not (2 <= u < image.shape[1] - 2 and 2 <= v < image.shape[0] - 2):
                    continue
                checked += 1
                matched += bool(matches_colour(image[int(round(v)), int(round(u))], CLASS_SPECS[name].colour)[0])
    assert checked >= 20
    assert matched / checked > 0.75  # the rest are hidden behind nearer objects


def test_generation_is_deterministic_for_a_seed(tmp_path):
    roots = [str(tmp_path / name) for name in ('a', 'b', 'c')]
    for root, seed in zip(roots, (3, 3, 4)):
        generate_synthetic_nuscenes(SyntheticConfig(root=root, version=VERSION, num_scenes=1, num_val_scenes=0,
                                                    samples_per_scene=1, sweeps_per_sample=1, seed=seed,
                                                    image_size=(64, 36), objects_per_scene=4, lidar_beams=8,
                                                    lidar_azimuths=90), log=None)
    files = sorted(osp.relpath(osp.join(d, f), roots[0]) for d, _, fs in os.walk(roots[0]) for f in fs)
    assert len(files) > 20
    _, mismatch, errors = filecmp.cmpfiles(roots[0], roots[1], files, shallow=False)
    assert mismatch == [] and errors == []
    _, mismatch, _ = filecmp.cmpfiles(roots[0], roots[2], [f for f in files if f.endswith('.json')], shallow=False)
    assert f'{VERSION}/sample_annotation.json' in mismatch


def test_cli_writes_the_requested_size(tmp_path, capsys):
    from nuscenes import NuScenes
    make_synthetic_main(['--root', str(tmp_path), '--scenes', '2', '--samples', '1', '--sweeps', '0', '--objects', '3',
                         '--image-size', '64', '36', '--lidar-beams', '8', '--lidar-azimuths', '90', '--quiet'])
    assert 'done in' in capsys.readouterr().out
    nusc = NuScenes(version=VERSION, dataroot=str(tmp_path), verbose=False)
    assert len(nusc.scene) == 2 and len(nusc.sample) == 2


def test_bad_sizes_are_rejected(tmp_path):
    with pytest.raises(ValueError, match='num_val_scenes'):
        generate_synthetic_nuscenes(SyntheticConfig(root=str(tmp_path), num_scenes=1, num_val_scenes=2), log=None)
    with pytest.raises(ValueError, match='v1.0-mini has 8 train'):
        generate_synthetic_nuscenes(SyntheticConfig(root=str(tmp_path), num_scenes=12, num_val_scenes=2), log=None)
    with pytest.raises(ValueError, match='sweeps_per_sample'):
        generate_synthetic_nuscenes(SyntheticConfig(root=str(tmp_path), sweeps_per_sample=10), log=None)


def test_object_range_bounds_every_annotation_in_the_ego_frame(tmp_path):
    from nuscenes import NuScenes
    from pyquaternion import Quaternion
    root = str(tmp_path)
    generate_synthetic_nuscenes(SyntheticConfig(root=root, version=VERSION, num_scenes=2, num_val_scenes=1,
                                                samples_per_scene=3, sweeps_per_sample=1, image_size=(64, 36),
                                                objects_per_scene=14, lidar_beams=8, lidar_azimuths=90,
                                                object_range=20.0), log=None)
    nusc = NuScenes(version=VERSION, dataroot=root, verbose=False)
    offsets = []
    for ann in nusc.sample_annotation:
        sample = nusc.get('sample', ann['sample_token'])
        pose = nusc.get('ego_pose', nusc.get('sample_data', sample['data']['LIDAR_TOP'])['ego_pose_token'])
        offset = Quaternion(pose['rotation']).inverse.rotate(np.subtract(ann['translation'], pose['translation']))
        offsets.append(offset[:2])
    offsets = np.abs(np.asarray(offsets))
    assert len(offsets) >= 2 * 3 * 10  # every class still fits in every scene
    assert offsets.max() <= 20.0
    with pytest.raises(ValueError, match='max_abs_xy'):
        generate_synthetic_nuscenes(SyntheticConfig(root=str(tmp_path / 'b'), num_scenes=1, num_val_scenes=0,
                                                    object_range=5.0), log=None)


def front_and_rear(root: str):
    """Over the info files' LiDAR boxes: how many were checked, the share whose front part's points reach higher than
    the rear part's, and per box the front part's mean intensity minus the rear part's."""
    import pickle
    taller_front = checked = 0
    brighter = []
    for split in ('train', 'val'):
        with open(osp.join(root, f'nuscenes_infos_{split}.pkl'), 'rb') as f:
            infos = pickle.load(f)['infos']
        for info in infos:
            points = np.fromfile(info['lidar_path'], dtype=np.float32).reshape(-1, 5)
            xyz, intensity = points[:, :3], points[:, 3]
            for x, y, z, length, width, height, yaw in info['gt_boxes'][:, :7]:
                offset = xyz - [x, y, z]  # z: the box's gravity centre
                along = offset[:, 0] * np.cos(yaw) + offset[:, 1] * np.sin(yaw)
                across = -offset[:, 0] * np.sin(yaw) + offset[:, 1] * np.cos(yaw)
                inside = (np.abs(along) <= length / 2) & (np.abs(across) <= width / 2) & (np.abs(offset[:, 2]) <= height / 2)
                front, rear = inside & (along > 0.05 * length), inside & (along < -0.05 * length)
                if front.sum() < 5 or rear.sum() < 5:
                    continue
                checked += 1
                taller_front += offset[front, 2].max() > offset[rear, 2].max() + 0.2 * height
                front_part, rear_part = inside & (along > 0.15 * length), inside & (along < 0)
                if front_part.sum() >= 5 and rear_part.sum() >= 5:
                    brighter.append(intensity[front_part].mean() - intensity[rear_part].mean())
    return checked, taller_front / max(checked, 1), np.array(brighter)


@pytest.fixture(scope='module')
def bright_front_nuscenes(tmp_path_factory) -> str:
    """The ``synthetic_nuscenes`` set made with ``--front-intensity-offset 40``."""
    from tools import create_data, make_synthetic_nuscenes
    root = str(tmp_path_factory.mktemp('bright_front'))
    make_synthetic_nuscenes.main(['--root', root, '--version', 'v1.0-mini', '--scenes', '2', '--val-scenes', '1',
                                  '--samples', '2', '--sweeps', '1', '--image-size', '320', '180', '--lidar-beams', '16',
                                  '--lidar-azimuths', '360', '--front-intensity-offset', '40', '--quiet'])
    create_data.main(['nuscenes', '--root-path', root, '--out-dir', root, '--extra-tag', 'nuscenes', '--version',
                      'v1.0-mini'])
    return root


def test_lidar_shows_the_heading_as_a_taller_front_in_the_converted_boxes(synthetic_nuscenes):
    """In the info files' LiDAR boxes, the points in the front part reach higher than those in the rear part; front
    and rear are equally bright by default."""
    checked, taller, brighter = front_and_rear(synthetic_nuscenes)
    assert checked >= 8 and taller > 0.8
    assert len(brighter) >= 8 and abs(np.median(brighter)) < 5.0


def test_a_front_intensity_offset_makes_the_front_brighter_by_it(bright_front_nuscenes):
    checked, taller, brighter = front_and_rear(bright_front_nuscenes)
    assert checked >= 8 and taller > 0.8
    assert len(brighter) >= 8 and np.median(brighter) == pytest.approx(40.0, abs=8.0)


def test_cameras_show_the_heading_as_a_white_front_face():
    from tools.data_converter.synthetic.camera import box_corners, render_image
    from tools.data_converter.synthetic.lidar import BoxSet
    from tools.data_converter.synthetic.shape import FRONT_FACE_BGR, object_parts
    width, height = 320, 180
    intrinsic = np.array([[160.0, 0.0, 160.0], [0.0, 160.0, 90.0], [0.0, 0.0, 1.0]])
    # a level camera at the origin looking along global +x: camera x = -y, y = -z, z = +x
    global2cam = np.eye(4)
    global2cam[:3, :3] = [[0.0, -1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]]
    global2cam[:3, 3] = [0.0, 1.0, 0.0]  # the camera 1 m above the ground
    car = CLASS_SPECS['car']
    colours = {}
    for facing, yaw in (('towards', np.pi), ('away', 0.0)):
        boxes = BoxSet(centers=np.array([[12.0, 0.0, 0.85]]), lwh=np.array([[4.6, 1.95, 1.7]]), yaws=np.array([yaw]),
                       intensities=np.array([60.0]))
        parts, _, is_front = object_parts(boxes)
        corners = [box_corners(parts.centers[i], parts.lwh[i], parts.yaws[i]) for i in range(len(parts))]
        image = render_image(intrinsic, global2cam, corners, [car.colour] * len(parts), width, height,
                             [FRONT_FACE_BGR if front else None for front in is_front])
        colours[facing] = image[int(height / 2 + 0.5 * 160 / 12), width // 2]  # 0.5 m above the camera, in the middle
    assert matches_colour(colours['towards'], FRONT_FACE_BGR)[0] and colours['towards'].min() > 200
    assert matches_colour(colours['away'], car.colour)[0]


def test_object_parts_fill_the_annotated_box():
    from tools.data_converter.synthetic.lidar import BoxSet
    from tools.data_converter.synthetic.shape import FRONT_LENGTH_SHARE, REAR_HEIGHT_SHARE, object_parts
    boxes = BoxSet(centers=np.array([[3.0, -2.0, 1.0]]), lwh=np.array([[5.0, 2.0, 2.0]]), yaws=np.array([np.pi / 2]),
                   intensities=np.array([50.0]))
    parts, owner, is_front = object_parts(boxes)
    assert owner.tolist() == [0, 0] and is_front.tolist() == [True, False]
    assert parts.intensities.tolist() == [50.0, 50.0]
    assert object_parts(boxes, front_intensity_offset=40.0)[0].intensities.tolist() == [90.0, 50.0]
    front, rear = parts.centers
    assert np.allclose(front, [3.0, -2.0 + (5.0 - 5.0 * FRONT_LENGTH_SHARE) / 2, 1.0])  # heading +y: front at +y
    assert np.allclose(parts.lwh, [[5.0 * FRONT_LENGTH_SHARE, 2.0, 2.0],
                                   [5.0 * (1 - FRONT_LENGTH_SHARE), 2.0, 2.0 * REAR_HEIGHT_SHARE]])
    assert rear[1] - parts.lwh[1, 0] / 2 == pytest.approx(-2.0 - 2.5)  # the rear part ends at the box's back
    assert rear[2] - parts.lwh[1, 2] / 2 == pytest.approx(0.0)  # and stands on the ground
