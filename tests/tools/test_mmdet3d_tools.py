"""mmdet3d's own tools (installed with it under ``mmdet3d/.mim/tools/``) on this project's configs, data and logs.

The published configs import the plugin through ``custom_imports``, which mmcv's ``Config.fromfile`` reads, so
mmdet3d's scripts, which do not read ``plugin=True``, find the plugin's datasets and models with nothing imported
by hand: ``misc/browse_dataset.py`` saves the training samples of the R50 CMT-AQR config (full size, its own
pipeline with GT sampling, on the synthetic set) as point and box meshes, and ``analysis_tools/analyze_logs.py
plot_curve`` plots the loss of a ``.log.json`` that tools/train.py wrote.
"""
import glob
import json
import os.path as osp
import sys

import mmdet3d
import pytest
from mmcv import Config

MMDET3D_TOOLS = osp.join(osp.dirname(mmdet3d.__file__), '.mim', 'tools')
PUBLISHED = sorted(glob.glob(osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs',
                                      'cmt_*.py')))


@pytest.mark.parametrize('path', PUBLISHED, ids=osp.basename)
def test_published_configs_import_the_plugin_through_custom_imports(path):
    cfg = Config.fromfile(path, import_custom_modules=False)
    assert cfg.custom_imports == dict(imports=['projects.mmdet3d_plugin'], allow_failed_imports=False)
    assert cfg.plugin is True and cfg.plugin_dir == 'projects/mmdet3d_plugin/'


@pytest.mark.slow(seconds=35)
def test_browse_dataset_saves_the_samples_of_a_published_config(synthetic_nuscenes, tools_cli, tmp_path):
    cfg = tools_cli.set_data_root(Config.fromfile(osp.join(tools_cli.repo_root, 'configs',
                                                           'cmt_aqr_voxel0100_r50_800x320_cbgs.py')),
                                  synthetic_nuscenes)
    cfg.data.train.dataset.version = 'v1.0-mini'
    config = str(tmp_path / 'cmt_aqr_r50.py')
    cfg.dump(config)
    out_dir = tmp_path / 'browse'
    tools_cli.run([sys.executable, osp.join(MMDET3D_TOOLS, 'misc', 'browse_dataset.py'), config, '--task', 'det',
                   '--aug', '--output-dir', str(out_dir), '--cfg-options', 'data.train.type=RepeatDataset',
                   'data.train.times=1'])
    samples = sorted(path.name for path in out_dir.iterdir())
    assert len(samples) == 2  # the 2 training samples of the synthetic set, each once
    for sample in samples:
        assert {path.name for path in (out_dir / sample).iterdir()} == {f'{sample}_points.obj', f'{sample}_gt.obj'}


@pytest.mark.slow(seconds=15)
def test_analyze_logs_plots_the_loss_of_a_training_log(synthetic_nuscenes, tools_cli, train_in_process, tmp_path):
    config = str(tmp_path / 'cmt_slim.py')
    tools_cli.tiny_config(synthetic_nuscenes, base='demo/cmt_synthetic_tiny.py', slim=True).dump(config)
    train_in_process([config, '--work-dir', str(tmp_path / 'work'), '--no-validate'])
    logs = glob.glob(str(tmp_path / 'work' / '*.log.json'))
    assert len(logs) == 1 and [json.loads(line).get('mode') for line in open(logs[0])][1:] == ['train'] * 2
    curve = tmp_path / 'loss.png'
    out = tools_cli.run([sys.executable, osp.join(MMDET3D_TOOLS, 'analysis_tools', 'analyze_logs.py'), 'plot_curve',
                         logs[0], '--keys', 'loss', 'loss_bbox', '--backend', 'agg', '--out', str(curve)])
    assert f'save curve to: {curve}' in out and curve.read_bytes().startswith(b'\x89PNG')
