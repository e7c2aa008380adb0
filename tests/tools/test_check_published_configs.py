"""tools/check_published_configs.py: a published config, unchanged but for its data root and schedule length,
trains in 2 processes through tools/dist_train.sh, tests through tools/dist_test.sh and writes a submission; a
fine-tune config does the same from the checkpoint its CMT config's check trained.

The CI-sized slice: the R50 CMT-AQR fine-tune config for one iteration (one sample per process) from the R50 CMT
config trained one iteration, on a nuScenes-shaped set of one train and one val key frame (``--preset
nuscenes-mini`` with one sweep and a sparse LiDAR).
"""
import json
import os.path as osp

import pytest
import torch
from mmcv import Config

from projects.mmdet3d_plugin.experiments.published_configs import (FINETUNE_CONFIGS, PUBLISHED_CONFIGS, ConfigCheck,
                                                                   check_config, checked_config,
                                                                   checkpoint_loss_scale, results_table,
                                                                   source_config, train_log_summary)
from projects.mmdet3d_plugin.utils.repo_paths import REPO_ROOT
from tools import check_published_configs, create_data, make_synthetic_nuscenes

SLICE_CONFIG = 'cmt_aqr_voxel0100_r50_800x320_cbgs'
FINETUNE_SLICE = 'cmt_aqr_voxel0100_r50_800x320_finetune_1e'


@pytest.fixture(scope='module')
def nuscenes_shaped(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp('nuscenes_shaped'))
    make_synthetic_nuscenes.main(['--preset', 'nuscenes-mini', '--root', root, '--scenes', '2', '--samples', '1',
                                  '--sweeps', '1', '--lidar-azimuths', '360', '--objects', '10', '--quiet'])
    create_data.main(['nuscenes', '--root-path', root, '--version', 'v1.0-mini', '--max-sweeps', '1'])
    return root


def test_the_six_published_configs_are_checked_and_only_their_schedule_and_data_root_change(nuscenes_shaped):
    names = [osp.basename(path) for path in PUBLISHED_CONFIGS]
    assert len(names) == 6 and sum(name.startswith('cmt_aqr_') for name in names) == 2
    original = Config.fromfile(osp.join(REPO_ROOT, 'configs', f'{SLICE_CONFIG}.py'))
    checked = checked_config(f'configs/{SLICE_CONFIG}.py', nuscenes_shaped, iters=3)
    assert checked.runner == dict(type='IterBasedRunner', max_iters=3)
    assert checked.checkpoint_config.interval == 3 and checked.log_config.interval == 1
    for key in ('model', 'optimizer', 'optimizer_config', 'lr_config', 'momentum_config'):
        assert checked[key] == original[key], key
    assert checked.data.train.type == 'CBGSDataset'
    train_types = [step['type'] for step in checked.data.train.dataset.pipeline]
    assert train_types == [step['type'] for step in original.data.train.dataset.pipeline]
    assert checked.data.train.dataset.ann_file == osp.join(nuscenes_shaped, 'nuscenes_infos_train.pkl')
    assert 'custom_hooks' not in checked
    listed = checked_config(f'configs/{SLICE_CONFIG}.py', nuscenes_shaped, iters=3, host_syncs=True)
    assert listed.custom_hooks == [dict(type='HostSyncReportHook', start=1, iters=2)]
    assert checked_config(f'configs/{SLICE_CONFIG}.py', nuscenes_shaped, iters=1,
                          host_syncs=True).custom_hooks[0]['start'] == 0
    flipped = not original.model.img_backbone.get('with_cp', False)
    options = check_published_configs.parse_args(['--cfg-options', f'model.img_backbone.with_cp={flipped}']).cfg_options
    with_cp = checked_config(f'configs/{SLICE_CONFIG}.py', nuscenes_shaped, iters=3, cfg_options=options)
    assert with_cp.model.img_backbone.with_cp is flipped and with_cp.model.img_backbone.type == \
        original.model.img_backbone.type
    with pytest.raises(SystemExit, match='not published configs'):
        check_published_configs.select_configs(['demo/cmt_synthetic_tiny'])


def test_log_summary_and_table_flag_a_non_finite_loss(tmp_path):
    lines = [dict(mode='train', iter=1, time=9.0, loss=1.0), dict(mode='train', iter=2, time=4.0, loss=float('nan'))]
    (tmp_path / '20260101_000000.log.json').write_text('\n'.join(json.dumps(line) for line in lines))
    summary = train_log_summary(str(tmp_path))
    assert summary == dict(seconds_per_iter=4.0, losses_finite=False, peak_gpu_mib=None, host_syncs_per_iter=None)
    table = results_table([ConfigCheck('configs/x.py', **summary)])
    assert '| x.py | 4.0 |' in table and '**no**' in table
    (tmp_path / '20260101_000000.log').write_text('INFO - HostSyncReportHook: iterations 1-2, host syncs / iter: 2.5\n')
    summary = train_log_summary(str(tmp_path))
    assert summary['host_syncs_per_iter'] == 2.5
    assert '| **no** | 2.5 | - |' in results_table([ConfigCheck('configs/x.py', **summary)])
    assert '| **no** | 2.5 | 256 |' in results_table([ConfigCheck('configs/x.py', loss_scale=256.0, **summary)])


def test_the_loss_scale_is_read_from_the_checkpoint_meta(tmp_path):
    path = str(tmp_path / 'latest.pth')
    torch.save(dict(meta=dict(fp16=dict(loss_scaler=dict(scale=128.0, _growth_tracker=3))), state_dict={}), path)
    assert checkpoint_loss_scale(path) == 128.0
    torch.save(dict(meta=dict(fp16=dict(loss_scaler={})), state_dict={}), path)  # a disabled scaler (no CUDA)
    assert checkpoint_loss_scale(path) is None
    torch.save(dict(meta=None, state_dict={}), path)
    assert checkpoint_loss_scale(path) is None


def test_the_fine_tune_configs_are_checked_from_their_cmt_configs_checkpoint(nuscenes_shaped, tmp_path):
    assert [osp.basename(path) for path in FINETUNE_CONFIGS] == [
        'cmt_aqr_voxel0075_vov_1600x640_finetune_1e.py', 'cmt_aqr_voxel0075_vov_1600x640_finetune_1e_router_only.py',
        'cmt_aqr_voxel0100_r50_800x320_finetune_1e.py', 'cmt_aqr_voxel0100_r50_800x320_finetune_1e_router_only.py',
        'cmt_voxel0075_vov_1600x640_finetune_1e.py', 'cmt_voxel0100_r50_800x320_finetune_1e.py']
    assert {path: source_config(path) for path in FINETUNE_CONFIGS if 'r50' in path} == dict.fromkeys(
        [path for path in FINETUNE_CONFIGS if 'r50' in path], 'configs/cmt_voxel0100_r50_800x320_cbgs.py')
    assert source_config(f'configs/{SLICE_CONFIG}.py') is None
    # its first epoch: no GT sampling, no epoch hook (the check's runner counts iterations)
    checked = checked_config(f'configs/finetune/{FINETUNE_SLICE}.py', nuscenes_shaped, iters=2)
    original = Config.fromfile(osp.join(REPO_ROOT, 'configs', 'finetune', f'{FINETUNE_SLICE}.py'))
    assert 'custom_hooks' not in checked and checked.load_from == original.load_from
    assert [step['type'] for step in checked.data.train.dataset.pipeline] == [
        step['type'] for step in original.data.train.dataset.pipeline if step['type'] != 'UnifiedObjectSample']
    router_only = checked_config(f'configs/finetune/{FINETUNE_SLICE}_router_only.py', nuscenes_shaped, iters=2)
    assert [hook['type'] for hook in router_only.custom_hooks] == ['FreezeParametersHook']
    row = check_config(f'configs/finetune/{FINETUNE_SLICE}.py', nuscenes_shaped, str(tmp_path), 1, 2)
    assert row.failed.startswith('no checkpoint of configs/cmt_voxel0100_r50_800x320_cbgs.py at ') and \
        row.failed.endswith('(check that config first)')


@pytest.mark.slow(seconds=220)
def test_the_r50_cmt_aqr_fine_tune_trains_from_cmt_tests_and_submits_in_two_processes(nuscenes_shaped, tmp_path):
    rows_file = str(tmp_path / 'rows.json')
    returncode = check_published_configs.main(['--data-root', nuscenes_shaped, '--configs', FINETUNE_SLICE, '--iters',
                                               '1', '--samples-per-gpu', '1', '--workers-per-gpu', '0', '--work-dir',
                                               str(tmp_path / 'work'), '--json', rows_file])
    with open(rows_file) as f:
        source, row = json.load(f)
    assert source['config'] == 'configs/cmt_voxel0100_r50_800x320_cbgs.py' and source['nds'] is None  # trained only
    assert row['config'] == f'configs/finetune/{FINETUNE_SLICE}.py'
    assert row['failed'] == '' and returncode == 0, row
    assert row['losses_finite'] and row['seconds_per_iter'] > 0 and row['peak_host_mib'] > 0
    assert row['loss_scale'] is None  # the fp16 hook trains in fp32 without CUDA: its scaler saves no scale
    assert 0.0 <= row['nds'] <= 1.0
    train_log = next((tmp_path / 'work' / FINETUNE_SLICE / 'train').glob('*.log')).read_text()
    assert 'AQR parameters are not in the checkpoint (a CMT checkpoint) and keep their initialisation' in train_log
    assert row['submission_samples'] == 1


def test_an_interrupted_step_ends_the_processes_its_tool_started(tmp_path, monkeypatch):
    import subprocess
    import time

    from projects.mmdet3d_plugin.experiments import published_configs
    pid_file = tmp_path / 'child'
    process = subprocess.Popen(['bash', '-c', f'sleep 60 & echo $! > {pid_file}; wait'])
    while not pid_file.exists() or not pid_file.read_text().strip():
        time.sleep(0.05)
    child = int(pid_file.read_text())

    def interrupted_wait(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(published_configs, 'start_tool', lambda command, env: process)
    monkeypatch.setattr(process, 'wait', interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        published_configs.run_measured(['tools/x.sh'], {})
    subprocess.Popen.wait(process, timeout=10)
    time.sleep(0.2)
    assert not running(child)


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a killed process may stay a zombie until it is reaped)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rpartition(')')[2].split()[0] != 'Z'
    except FileNotFoundError:
        return False
