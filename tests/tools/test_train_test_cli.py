"""tools/dist_train.sh (2 CPU processes, gloo) and tools/test.py --eval bbox run end to end on synthetic nuScenes;
the configs' pipelines produce model inputs; the launch helpers of the tools.

The data: tools/make_synthetic_nuscenes.py (2 scenes x 2 samples, small images), converted by
tools/create_data.py. The config: configs/cmt_voxel0100_r50_800x320_cbgs.py shrunk for speed
(24 m range, 40 queries, 64 x 160 images, no CBGS, one epoch, one sample per process).
"""
import json
import os
import os.path as osp
import socket
import subprocess
import sys

import pytest
from mmcv import Config

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SMALL_RANGE = [-12.0, -12.0, -5.0, 12.0, 12.0, 3.0]
IMAGE_AUG = dict(resize_lim=(0.5, 0.5), final_dim=(64, 160), bot_pct_lim=(0.0, 0.0), rot_lim=(0.0, 0.0), H=180,
                 W=320, rand_flip=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _run(args, timeout=300, env=None):
    result = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, **(env or {})))
    assert result.returncode == 0, f'{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}'
    return result.stdout + result.stderr


def _shrink(node):
    """Point every range at SMALL_RANGE and every image augmentation at 64 x 160 outputs."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ('point_cloud_range', 'pc_range'):
                node[key] = list(SMALL_RANGE)
            elif key == 'data_aug_conf':
                node[key] = dict(IMAGE_AUG)
            else:
                _shrink(value)
    elif isinstance(node, list):
        for value in node:
            _shrink(value)


def _set_data_root(cfg, data_root):
    """Read the info files, the GT database and 320 x 180 images of ``data_root``."""
    def visit(node):
        if isinstance(node, dict):
            if 'info_path' in node:
                node['info_path'] = osp.join(data_root, 'nuscenes_dbinfos_train.pkl')
                if node.get('data_root') is not None:  # mmdet3d's sampler: paths relative to data_root
                    node['data_root'] = data_root
            if 'data_aug_conf' in node:
                node['data_aug_conf'] = dict(node['data_aug_conf'], H=180, W=320)
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(cfg._cfg_dict)
    for split, info in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        cfg.data[split].data_root = data_root
        cfg.data[split].ann_file = osp.join(data_root, f'nuscenes_infos_{info}.pkl')


def _tiny_config(data_root, path):
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', 'cmt_voxel0100_r50_800x320_cbgs.py'))
    cfg.data.train = cfg.data.train.dataset  # no CBGS resampling
    _set_data_root(cfg, data_root)
    _shrink(cfg._cfg_dict)
    cfg.data.samples_per_gpu, cfg.data.workers_per_gpu = 1, 0
    model = cfg.model
    model.pts_bbox_head.num_query = 40
    model.pts_voxel_layer.max_voxels = (4000, 4000)
    grid = int(round((SMALL_RANGE[3] - SMALL_RANGE[0]) / model.pts_voxel_layer.voxel_size[0]))
    model.pts_middle_encoder.sparse_shape = [41, grid, grid]
    model.train_cfg.pts.grid_size = model.test_cfg.pts.grid_size = [grid, grid, 40]
    cfg.runner = dict(type='EpochBasedRunner', max_epochs=1)
    cfg.log_config = dict(interval=1, hooks=[dict(type='TextLoggerHook')])
    cfg.dump(path)


@pytest.fixture(scope='module')
def synthetic_nuscenes(tmp_path_factory):
    """2 scenes x 2 samples of synthetic nuScenes with info files and GT database (the tools' main functions)."""
    from tools import create_data, make_synthetic_nuscenes
    root = str(tmp_path_factory.mktemp('synthetic_nuscenes'))
    make_synthetic_nuscenes.main(['--root', root, '--scenes', '2', '--val-scenes', '1', '--samples', '2', '--sweeps',
                                  '1', '--image-size', '320', '180', '--lidar-beams', '16', '--lidar-azimuths', '360',
                                  '--quiet'])
    create_data.main(['nuscenes', '--root-path', root, '--out-dir', root, '--extra-tag', 'nuscenes', '--version',
                      'v1.0-mini'])
    return root


def test_dist_train_on_cpu_then_test_with_nuscenes_eval(synthetic_nuscenes, tmp_path):
    config = str(tmp_path / 'cmt_tiny.py')
    _tiny_config(synthetic_nuscenes, config)
    work_dir = tmp_path / 'work'
    cpu_only = dict(CUDA_VISIBLE_DEVICES='')
    out = _run(['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(work_dir), '--no-validate',
                '--cfg-options', 'optimizer.lr=0.0002'], timeout=400,
               env=dict(cpu_only, PYTHON=sys.executable, PORT=str(_free_port())))
    assert 'Distributed training: True, device: cpu' in out
    logs = sorted(work_dir.glob('*.log.json'))
    assert logs and (work_dir / 'latest.pth').exists()
    assert 'lr=0.0002' in (work_dir / 'cmt_tiny.py').read_text()  # --cfg-options reached the dumped config
    iterations = [json.loads(line) for line in logs[-1].read_text().splitlines()[1:]]
    assert iterations and all(it['mode'] == 'train' and it['loss'] == it['loss'] for it in iterations)

    results = tmp_path / 'results.pkl'
    out = _run([sys.executable, 'tools/test.py', config, str(work_dir / 'latest.pth'), '--eval', 'bbox', '--out',
                str(results), '--work-dir', str(work_dir)], env=cpu_only)
    assert 'NDS' in out and results.exists()
    metrics = json.loads(sorted(work_dir.glob('eval_*.json'))[-1].read_text())['metrics']
    assert 0.0 <= metrics['pts_bbox_NuScenes/NDS'] <= 1.0 and 'pts_bbox_NuScenes/mAP' in metrics
    assert sorted(work_dir.glob('test_*.log'))


@pytest.mark.parametrize('name', ['cmt_voxel0075_vov_1600x640_cbgs', 'cmt_lidar_voxel0075_cbgs',
                                  'cmt_camera_vov_1600x640_cbgs'])
def test_config_pipelines_yield_model_inputs(name, synthetic_nuscenes):
    """The train and test pipelines of each config (the R50 one runs above) produce what the model reads."""
    from mmdet3d.datasets import build_dataset

    import projects.mmdet3d_plugin  # noqa: F401
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', f'{name}.py'))
    cfg.data.train = cfg.data.train.dataset
    _set_data_root(cfg, synthetic_nuscenes)
    uses_camera = 'lidar' not in name
    for split, test_mode in (('train', False), ('test', True)):
        sample = build_dataset(cfg.data[split])[0]
        metas = sample['img_metas'].data if not test_mode else sample['img_metas'][0].data
        assert ('img' in sample) == uses_camera and ('points' in sample) == ('camera' not in name)
        if uses_camera:
            assert len(metas['lidar2img']) == 6 and metas['pad_shape'][0][:2] == (640, 1600)
        if not test_mode:
            assert sample['gt_bboxes_3d'].data.tensor.shape[1] == 9  # boxes with velocity


class _FakeRunner:
    def __init__(self, model):
        from mmcv.parallel import MMDataParallel
        self.model = MMDataParallel(model)
        self.meta = {}
        self.warnings = []
        self.logger = self

    def warning(self, message):
        self.warnings.append(message)


def test_fp16_hook_checks_module_names_and_falls_back_to_fp32_on_cpu():
    import torch
    from torch import nn

    from projects.mmdet3d_plugin.mmcv_custom import CustomFp16OptimizerHook
    model = nn.Module()
    model.pts_bbox_head = nn.Linear(2, 2)
    model.pts_bbox_head.fp16_enabled = False
    with pytest.raises(KeyError, match='img_backbone'):
        CustomFp16OptimizerHook(custom_fp16=dict(img_backbone=False)).before_run(_FakeRunner(model))
    runner = _FakeRunner(model)
    CustomFp16OptimizerHook(custom_fp16=dict(pts_bbox_head=False), loss_scale='dynamic').before_run(runner)
    if not torch.cuda.is_available():
        assert runner.warnings and 'fp32' in runner.warnings[0]
        assert model.pts_bbox_head.fp16_enabled is False


def test_config_loading_imports_the_plugin_and_rejects_bad_plugin_dirs(tmp_path):
    import argparse

    from projects.mmdet3d_plugin.mmcv_custom.launch import add_common_arguments, init_distributed, load_config
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    add_common_arguments(parser)
    config = osp.join(REPO_ROOT, 'configs', 'cmt_lidar_voxel0075_cbgs.py')
    args = parser.parse_args([config, '--cfg-options', 'model.pts_bbox_head.num_query=7'])
    assert load_config(args).model.pts_bbox_head.num_query == 7
    assert 'projects.mmdet3d_plugin' in sys.modules
    assert init_distributed('none') is False
    bad = tmp_path / 'bad.py'
    bad.write_text("_base_ = ['%s']\nplugin_dir = 'no_such_plugin/'\n" % config)
    with pytest.raises(ImportError, match='no_such_plugin'):
        load_config(parser.parse_args([str(bad)]))
