"""tools/dist_train.sh (2 CPU processes, gloo) and tools/test.py --eval bbox run end to end on synthetic nuScenes;
the configs' pipelines produce model inputs; the launch helpers of the tools.

The data and the config (configs/cmt_voxel0100_r50_800x320_cbgs.py shrunk for speed): tests/tools/conftest.py.
"""
import json
import os.path as osp
import sys

import pytest
from mmcv import Config

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.mark.slow(seconds=45)
def test_dist_train_on_cpu_then_test_with_nuscenes_eval(synthetic_nuscenes, tools_cli, tmp_path):
    config = str(tmp_path / 'cmt_tiny.py')
    tools_cli.tiny_config(synthetic_nuscenes).dump(config)
    work_dir = tmp_path / 'work'
    cpu_only = dict(CUDA_VISIBLE_DEVICES='')
    out = tools_cli.run(['bash', 'tools/dist_train.sh', config, '2', '--work-dir', str(work_dir), '--no-validate',
                         '--cfg-options', 'optimizer.lr=0.0002'], timeout=400,
                        env=dict(cpu_only, PYTHON=sys.executable, PORT=str(tools_cli.free_port())))
    assert 'Distributed training: True, device: cpu' in out
    logs = sorted(work_dir.glob('*.log.json'))
    assert logs and (work_dir / 'latest.pth').exists()
    assert 'lr=0.0002' in (work_dir / 'cmt_tiny.py').read_text()  # --cfg-options reached the dumped config
    iterations = [json.loads(line) for line in logs[-1].read_text().splitlines()[1:]]
    assert iterations and all(it['mode'] == 'train' and it['loss'] == it['loss'] for it in iterations)

    results = tmp_path / 'results.pkl'
    out = tools_cli.run([sys.executable, 'tools/test.py', config, str(work_dir / 'latest.pth'), '--eval', 'bbox',
                         '--out', str(results), '--work-dir', str(work_dir)], env=cpu_only)
    assert 'NDS' in out and results.exists()
    metrics = json.loads(sorted(work_dir.glob('eval_*.json'))[-1].read_text())['metrics']
    assert 0.0 <= metrics['pts_bbox_NuScenes/NDS'] <= 1.0 and 'pts_bbox_NuScenes/mAP' in metrics
    assert sorted(work_dir.glob('test_*.log'))


@pytest.mark.parametrize('name', ['cmt_voxel0075_vov_1600x640_cbgs', 'cmt_lidar_voxel0075_cbgs',
                                  'cmt_camera_vov_1600x640_cbgs'])
def test_config_pipelines_yield_model_inputs(name, synthetic_nuscenes, tools_cli):
    """The train and test pipelines of each config (the R50 one runs above) produce what the model reads."""
    from mmdet3d.datasets import build_dataset

    import projects.mmdet3d_plugin  # noqa: F401
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', f'{name}.py'))
    cfg.data.train = cfg.data.train.dataset
    cfg = tools_cli.set_data_root(cfg, synthetic_nuscenes)
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

    from projects.mmdet3d_plugin.mmcv_custom.launch import init_distributed, load_config
    from tools.cli.launch import add_common_arguments
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
