"""CustomNuScenesDataset on create_data output: CMT train / test pipelines, official evaluation, bad inputs."""
import copy
import os.path as osp
import pickle

import numpy as np
import pytest
import torch

from projects.mmdet3d_plugin.datasets.camera_geometry import project_points
from tools.data_converter.synthetic.layout import CLASS_SPECS

NUM_VIEWS = 6


def _colour_matches(pixels_bgr, colour_bgr):
    """A pixel is a shade of the class colour: cosine similarity of the BGR vectors > 0.97."""
    pixels = np.asarray(pixels_bgr, dtype=np.float64).reshape(-1, 3)
    colour = np.asarray(colour_bgr, dtype=np.float64)
    return pixels @ colour / (np.linalg.norm(pixels, axis=1) * np.linalg.norm(colour) + 1e-9) > 0.97


def _bgr_images(img_tensor, norm_cfg):
    """``[N, 3, H, W]`` normalised images -> list of ``[H, W, 3]`` BGR (to_rgb=False)."""
    images = img_tensor.permute(0, 2, 3, 1).numpy()
    return [img * norm_cfg['std'] + norm_cfg['mean'] for img in images]


def _centre_colour_hits(centres, names, images, metas, shift=0):
    """For each box centre seen in a view: whether the pixel (shifted right by ``shift``) shows its class colour."""
    hits = []
    for view, image in enumerate(images):
        height, width = metas['img_shape'][view][:2]
        uv, depth = project_points(centres, metas['lidar2img'][view])
        for (u, v), d, name in zip(uv, depth, names):
            u = u + shift
            if d > 1.0 and 1 <= u < width - 1 and 1 <= v < height - 1 and np.ptp(CLASS_SPECS[name].colour) > 60:
                hits.append(bool(_colour_matches(image[int(round(v)), int(round(u))], CLASS_SPECS[name].colour)[0]))
    return hits


@pytest.fixture(scope='module')
def train_dataset(synthetic_root, created_data, cmt):
    return cmt.build_dataset(synthetic_root, created_data['train'],
                             cmt.train_pipeline(created_data['dbinfos'], mixup_rate=-1, image_drop_prob=0.0,
                                                points_drop_prob=0.0), test_mode=False)


def test_train_pipeline_produces_cmt_inputs(synthetic_root, created_data, cmt):
    dataset = cmt.build_dataset(synthetic_root, created_data['train'], cmt.train_pipeline(created_data['dbinfos']),
                                test_mode=False)
    assert len(dataset) == 2 and dataset.version == cmt.VERSION
    np.random.seed(0)
    data = dataset[0]
    assert set(data) == {'points', 'img', 'gt_bboxes_3d', 'gt_labels_3d', 'img_metas'}
    img, metas = data['img'].data, data['img_metas'].data
    assert img.shape == (NUM_VIEWS, 3, 128, 256) and img.dtype == torch.float32
    assert data['points'].data.shape[1] == 5
    assert len(data['gt_bboxes_3d'].data) == len(data['gt_labels_3d'].data) > 0
    assert data['gt_bboxes_3d'].data.tensor.shape[1] == 9  # with velocity
    assert len(metas['lidar2img']) == NUM_VIEWS and all(m.shape == (4, 4) for m in metas['lidar2img'])
    assert metas['img_shape'] == [(128, 256, 3)] * NUM_VIEWS and metas['pad_shape'] == [(128, 256, 3)] * NUM_VIEWS
    assert isinstance(metas['dropped_modalities'], list)
    assert metas['transformation_3d_flow'][:3] == ['R', 'S', 'T']
    assert {'pcd_rotation', 'pcd_scale_factor', 'pcd_trans', 'pcd_horizontal_flip', 'img_norm_cfg'} <= set(metas)


def test_projected_gt_centres_land_on_the_objects_in_the_augmented_images(train_dataset, cmt):
    hits, control = [], []
    for seed in range(4):
        for index in range(len(train_dataset)):
            np.random.seed(seed)
            data = train_dataset[index]
            metas = data['img_metas'].data
            boxes = data['gt_bboxes_3d'].data
            names = [cmt.CLASS_NAMES[label] for label in data['gt_labels_3d'].data.tolist()]
            images = _bgr_images(data['img'].data, metas['img_norm_cfg'])
            centres = boxes.gravity_center.numpy()
            hits += _centre_colour_hits(centres, names, images, metas)
            control += _centre_colour_hits(centres, names, images, metas, shift=60)
    assert len(hits) >= 40
    assert np.mean(hits) > 0.75  # the rest are hidden behind nearer objects
    assert np.mean(control) < 0.3


def test_dropped_modalities_match_the_data(synthetic_root, created_data, cmt):
    dataset = cmt.build_dataset(synthetic_root, created_data['train'],
                                cmt.train_pipeline(created_data['dbinfos'], image_drop_prob=0.5, points_drop_prob=0.5),
                                test_mode=False)
    seen = set()
    zero_image = -np.asarray(cmt.IMG_NORM_CFG['mean']) / np.asarray(cmt.IMG_NORM_CFG['std'])
    for seed in range(6):
        np.random.seed(seed)
        data = dataset[seed % 2]
        dropped = data['img_metas'].data['dropped_modalities']
        img = data['img'].data.permute(0, 2, 3, 1).numpy()
        points = data['points'].data.numpy()
        assert len(dropped) == 1
        seen.update(dropped)
        # The pipeline moved the zeroed points together: they all sit at one spot, with zero features.
        assert (np.ptp(points, axis=0).max() < 1e-5) == ('points' in dropped)
        assert np.allclose(img, zero_image.astype(np.float32), atol=1e-5) == ('image' in dropped)
    assert seen == {'points', 'image'}


def test_test_pipeline_projects_val_boxes_onto_their_objects(synthetic_root, created_data, cmt):
    dataset = cmt.build_dataset(synthetic_root, created_data['val'], cmt.test_pipeline(), test_mode=True)
    hits = []
    for index, info in enumerate(dataset.data_infos):
        data = dataset[index]
        metas = data['img_metas'][0].data
        img = data['img'][0].data
        assert img.shape == (NUM_VIEWS, 3, 128, 256) and len(metas['lidar2img']) == NUM_VIEWS
        assert metas['sample_idx'] == info['token']
        hits += _centre_colour_hits(info['gt_boxes'][:, :3], list(info['gt_names']),
                                    _bgr_images(img, metas['img_norm_cfg']), metas)
    assert len(hits) >= 10 and np.mean(hits) > 0.75


def _gt_as_predictions(dataset, cmt, drop_all=False):
    from mmdet3d.core.bbox import LiDARInstance3DBoxes
    results = []
    for info in dataset.data_infos:
        keep = np.isin(info['gt_names'], cmt.CLASS_NAMES) & info['valid_flag'] & (not drop_all)
        boxes = np.concatenate([info['gt_boxes'], np.nan_to_num(info['gt_velocity'])], axis=1)[keep]
        labels = [cmt.CLASS_NAMES.index(name) for name in info['gt_names'][keep]]
        results.append(dict(pts_bbox=dict(
            boxes_3d=LiDARInstance3DBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 9), box_dim=9,
                                          origin=(0.5, 0.5, 0.5)),
            scores_3d=torch.ones(len(labels)), labels_3d=torch.tensor(labels, dtype=torch.long))))
    return results


def test_official_evaluation_of_the_ground_truth_is_perfect_and_of_nothing_is_zero(synthetic_root, created_data, cmt,
                                                                                    tmp_path):
    dataset = cmt.build_dataset(synthetic_root, created_data['val'], cmt.test_pipeline(), test_mode=True)
    metrics = dataset.evaluate(_gt_as_predictions(dataset, cmt), jsonfile_prefix=str(tmp_path / 'gt'))
    assert metrics['pts_bbox_NuScenes/mAP'] > 0.95
    assert metrics['pts_bbox_NuScenes/NDS'] > 0.9
    assert metrics['pts_bbox_NuScenes/mATE'] < 0.05
    assert osp.isfile(tmp_path / 'gt' / 'pts_bbox' / 'metrics_summary.json')
    empty = dataset.evaluate(_gt_as_predictions(dataset, cmt, drop_all=True), jsonfile_prefix=str(tmp_path / 'none'))
    assert empty['pts_bbox_NuScenes/mAP'] == 0.0


def test_missing_inputs_are_named(synthetic_root, created_data, cmt, tmp_path):
    with pytest.raises(FileNotFoundError, match='info file not found.*nope.pkl'):
        cmt.build_dataset(synthetic_root, str(tmp_path / 'nope.pkl'), [], test_mode=True)
    with pytest.raises(FileNotFoundError, match='data root not found.*no_root'):
        cmt.build_dataset(str(tmp_path / 'no_root'), created_data['val'], [], test_mode=True)
    with pytest.raises(ValueError, match=r"nuscenes_infos_val\.pkl holds nuScenes version 'v1.0-mini'.*v1.0-trainval"):
        cmt.build_dataset(synthetic_root, created_data['val'], [], test_mode=True, version='v1.0-trainval')
    dataset = cmt.build_dataset(str(tmp_path), created_data['val'], [], test_mode=True)
    with pytest.raises(FileNotFoundError, match='v1.0-mini tables'):
        dataset.evaluate(_gt_as_predictions(dataset, cmt), jsonfile_prefix=str(tmp_path / 'eval'))


@pytest.mark.parametrize('what', ['lidar', 'sweep', 'image'])
def test_missing_data_files_are_named(synthetic_root, created_data, cmt, tmp_path, what):
    with open(created_data['val'], 'rb') as f:
        data = pickle.load(f)
    info = data['infos'][0]
    missing = str(tmp_path / f'missing_{what}.bin')
    if what == 'lidar':
        info['lidar_path'] = missing
    elif what == 'sweep':
        info['sweeps'][0]['data_path'] = missing
    else:
        info['cams']['CAM_BACK']['data_path'] = missing
    ann_file = str(tmp_path / 'infos.pkl')
    with open(ann_file, 'wb') as f:
        pickle.dump(data, f)
    dataset = cmt.build_dataset(synthetic_root, ann_file, copy.deepcopy(cmt.LOADING_PIPELINE), test_mode=True)
    index = [i['token'] for i in dataset.data_infos].index(info['token'])
    with pytest.raises(FileNotFoundError, match=missing):
        dataset[index]


def test_ground_truth_as_head_outputs_decodes_to_a_perfect_evaluation(synthetic_root, created_data, cmt, tmp_path):
    """The whole box chain of training and testing, without a network in between.

    The annotations the loss sees (``get_ann_info``) are turned into the head's
    targets (gravity centre, regression code), fed back as the head's
    per-task outputs, decoded by ``CmtHead.get_bboxes`` and evaluated with the
    official devkit: every error (centre, size, orientation, velocity) is ~0,
    so the code layout, the z origin and the yaw convention agree end to end.
    """
    from mmdet3d.core import bbox3d2result
    from mmdet.models.builder import build_head
    from projects.mmdet3d_plugin.core.bbox.util import normalize_bbox
    model_cfg = cmt.cfg.model
    from projects.mmdet3d_plugin.config_upgrade import upgrade_model_config
    head = build_head(upgrade_model_config(dict(model_cfg.pts_bbox_head, train_cfg=model_cfg.train_cfg.pts,
                                                test_cfg=model_cfg.test_cfg.pts)))
    dataset = cmt.build_dataset(synthetic_root, created_data['val'], cmt.test_pipeline(), test_mode=True)
    offsets = np.cumsum([0] + head.num_classes)
    results = []
    for index in range(len(dataset)):
        ann = dataset.get_ann_info(index)
        boxes, labels = head.detection_loss.gt_boxes_and_labels([ann['gt_bboxes_3d']],
                                                                [torch.as_tensor(ann['gt_labels_3d'])],
                                                                torch.device('cpu'))
        keep = labels[0] >= 0
        code, labels = normalize_bbox(boxes[0][keep]).float(), labels[0][keep]
        code[:, 8:] = torch.nan_to_num(code[:, 8:])
        preds_dicts = []
        for task, num_cls in enumerate(head.num_classes):
            logits = torch.full((1, 1, len(labels), num_cls), -10.0)
            in_task = (labels >= offsets[task]) & (labels < offsets[task + 1])
            logits[0, 0, in_task, labels[in_task] - offsets[task]] = 10.0
            outputs = dict(center=code[:, 0:2], height=code[:, 2:3], dim=code[:, 3:6], rot=code[:, 6:8],
                           vel=code[:, 8:10])
            preds_dicts.append([dict({k: v[None, None] for k, v in outputs.items()}, cls_logits=logits)])
        (decoded, scores, decoded_labels), = head.get_bboxes(preds_dicts, [dict(box_type_3d=type(ann['gt_bboxes_3d']))])
        results.append(dict(pts_bbox=bbox3d2result(decoded, scores, decoded_labels)))
    metrics = dataset.evaluate(results, jsonfile_prefix=str(tmp_path / 'oracle'))
    assert metrics['pts_bbox_NuScenes/mAP'] > 0.95
    for error in ('mATE', 'mASE', 'mAOE'):
        assert metrics[f'pts_bbox_NuScenes/{error}'] < 0.02, error
    assert metrics['pts_bbox_NuScenes/mAVE'] < 0.05
