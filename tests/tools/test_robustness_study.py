"""tools/robustness_study.py: the --quick study end to end, and its summary of the seeds."""
import json

import pytest
import torch
from mmcv import Config

from tools import demo
from tools import robustness_study as study

AQR_PREFIXES = tuple(f'pts_bbox_head.{name}.' for name in ('aqr_weight_generator', 'attention_bias_generator'))


def _result(corruption, nds, mAP=0.1):
    if nds is None:
        return dict(corruption=corruption, status='failed', error='RuntimeError: x')
    return dict(corruption=corruption, status='ok', NDS=nds, mAP=mAP)


def test_summary_has_mean_range_and_per_seed_differences():
    runs = dict(cmt=[{'clean': _result('clean', 0.30)}, {'clean': _result('clean', 0.20)}],
                control=[{'clean': _result('clean', 0.40)}, {'clean': _result('clean', 0.10)}],
                cmt_aqr=[{'clean': _result('clean', 0.50)}, {'clean': _result('clean', None)}])
    row = study.summarise(runs, ['clean'])['clean']
    assert row['control']['NDS'] == dict(mean=pytest.approx(0.25), min=0.10, max=0.40, n=2)
    assert row['cmt_aqr']['NDS'] == dict(mean=0.50, min=0.50, max=0.50, n=1)  # the failed seed is left out
    # differences are paired by seed: only seed 0 has both runs
    assert row['aqr_minus_control']['NDS']['mean'] == pytest.approx(0.10)
    assert row['aqr_minus_cmt']['NDS']['mean'] == pytest.approx(0.20)
    assert row['aqr_minus_cmt']['NDS']['n'] == 1


def test_modality_drop_probabilities_reach_the_training_pipeline():
    cfg = Config.fromfile(demo.CONFIGS['cmt'])
    study.set_modality_drop(cfg, 0.1, 0.4)
    (step, ) = [step for step in cfg.data.train.pipeline if step['type'] == 'ModalMask3D']
    assert (step['image_drop_prob'], step['points_drop_prob']) == (0.1, 0.4)
    cfg.data.train.pipeline = [s for s in cfg.data.train.pipeline if s['type'] != 'ModalMask3D']
    with pytest.raises(ValueError, match='no ModalMask3D'):
        study.set_modality_drop(cfg, 0.1, 0.4)


def test_baselines_choose_stage1_and_control_configs():
    fixed = study.parse_args(['--baseline', 'fixed_window'])
    plain = study.parse_args(['--baseline', 'cmt'])
    assert study.model_config(fixed, 'cmt') == study.model_config(fixed, 'control') == \
        'configs/demo/cmt_aqr_synthetic_tiny_fixed_routing.py'
    assert study.model_config(plain, 'cmt') == study.model_config(plain, 'control') == demo.CONFIGS['cmt']
    assert study.model_config(fixed, 'cmt_aqr') == study.model_config(plain, 'cmt_aqr') == study.AQR_STAGE2_CONFIG
    assert (fixed.work_dir, plain.work_dir) == ('work_dirs/study_fixed_window', 'work_dirs/study_cmt')


def _weights(path):
    return torch.load(path, map_location='cpu')['state_dict']


def test_quick_study_writes_tables_chart_and_pictures_and_freezes_all_but_aqr(tmp_path, capsys):
    work, data = tmp_path / 'work', tmp_path / 'data'
    argv = ['--quick', '--work-dir', str(work), '--data-root', str(data)]
    study.main(argv)
    report = work / 'report'
    text = (report / 'study.md').read_text()
    corruptions = list(study.QUICK_CORRUPTIONS)
    for score in ('NDS', 'mAP'):
        table = text.split(f'## {score}\n\n')[1].split('\n\n')[0].splitlines()
        assert [line.split(' | ')[0].lstrip('| ') for line in table[2:]] == corruptions
        assert all(len(line.split(' | ')) == 1 + len(study.MODELS) + 2 for line in table[2:])
    written = json.loads((report / 'study.json').read_text())
    summary, (aqr_run, ) = written['summary'], written['runs']['cmt_aqr']
    assert list(summary) == corruptions
    for corruption, row in summary.items():
        for model in study.MODELS:
            for score in ('NDS', 'mAP'):
                assert row[model][score]['n'] == 1 and 0.0 <= row[model][score]['mean'] <= 1.0
        # one seed: the difference is CMT-AQR's NDS minus the other arm's, as run and as shown in study.md
        for other in ('control', 'cmt'):
            (other_run, ) = written['runs'][other]
            difference = row[f'aqr_minus_{other}']['NDS']
            assert difference['mean'] == pytest.approx(aqr_run[corruption]['NDS'] - other_run[corruption]['NDS'])
            assert difference['n'] == 1
        table_row = text.split('## NDS\n\n')[1].split(f'| {corruption} | ')[1].split('\n')[0]
        assert f'{row["aqr_minus_control"]["NDS"]["mean"]:+.3f}' in table_row
    routing = json.loads((report / 'study.json').read_text())['routing']
    for corruption in corruptions:
        row = routing[corruption]
        assert row['samples'] == 2 and f'| {corruption} | {row["top"]["lidar"]:.3f} |' in text
        assert all(0.0 <= row[group][modality] <= 1.0 for group in ('top', 'all') for modality in ('lidar', 'camera'))
    assert (report / 'study_nds.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    for tag in ('object_drop_0p5', 'mixed_120'):
        for kind in ('bev', 'cameras', 'bias'):
            assert (report / f'study_{tag}_{kind}.png').exists()
            assert f'(study_{tag}_{kind}.png)' in text

    # stage 1 (the default fixed_window baseline) kept its AQR modules at their initialisation; stage 2 started
    # from it: CMT-AQR changed only its AQR modules (BatchNorm statistics kept), the control changed the
    # detector itself and left the AQR modules alone
    seed = work / 'seed0'
    stage1 = _weights(seed / 'cmt' / 'epoch_2.pth')
    aqr, control = _weights(seed / 'cmt_aqr' / 'epoch_1.pth'), _weights(seed / 'control' / 'epoch_1.pth')
    assert set(aqr) == set(stage1) == set(control)
    aqr_keys = {key for key in stage1 if key.startswith(AQR_PREFIXES)}
    assert aqr_keys
    changed_by_aqr = {key for key, value in stage1.items() if not torch.equal(aqr[key], value)}
    changed_by_control = {key for key, value in stage1.items() if not torch.equal(control[key], value)}
    assert changed_by_aqr and changed_by_aqr <= aqr_keys
    assert changed_by_control and not changed_by_control & aqr_keys

    capsys.readouterr()
    study.main(argv)  # a second run reuses every step
    out = capsys.readouterr().out
    assert out.count('exists') == 3 and out.count('has every corruption') == 3 and '$ ' not in out
