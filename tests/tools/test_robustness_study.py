"""tools/robustness_study.py: its options, and the --quick study end to end with every arm."""
import json

import pytest
import torch

from projects.mmdet3d_plugin.experiments.study_arms import STUDY_ARMS
from projects.mmdet3d_plugin.experiments.study_report import METRICS
from tools import robustness_study as study

AQR_PREFIXES = tuple(f'pts_bbox_head.{name}.' for name in ('aqr_weight_generator', 'attention_bias_generator'))
ROUTING_ARMS = ('global_gate', 'aqr_targets')


def test_defaults_are_three_seeds_and_every_corruption_after_clean():
    options = study.study_options(study.parse_args([]))
    assert options.seeds == [0, 1, 2] and options.scenes == 150 and not options.shared_stage1
    assert (options.stage1_epochs, options.stage2_epochs, options.score_threshold) == (12, 4, 0.3)
    assert options.corruptions[0] == 'clean' and len(options.corruptions) == 11
    assert (options.work_dir, options.out) == ('work_dirs/study', 'work_dirs/study/report')  # never docs/
    assert study.parse_args(['--out', 'docs/robustness']).out == 'docs/robustness'  # regenerating the shipped pages
    moved = study.study_options(study.parse_args(['--corruptions', 'lidar_drop', 'clean', '--score-thr', '0.5']))
    assert moved.corruptions == ['clean', 'lidar_drop'] and moved.score_threshold == 0.5
    quick = study.study_options(study.parse_args(['--quick']))
    assert (quick.seeds, quick.scenes, quick.stage2_epochs) == ([0], 2, 1)
    assert quick.corruptions == list(study.QUICK_CORRUPTIONS['failures'])
    assert quick.out == 'work_dirs/study_quick/report' and quick.design == 'failures'
    lies = study.study_options(study.parse_args(['--design', 'lies']))
    assert lies.design == 'lies' and lies.work_dir == 'work_dirs/study_lies'
    assert lies.out == 'work_dirs/study_lies/report'
    assert lies.corruptions[:5] == ['clean', 'lidar_ghost:3', 'view_yaw:2:20', 'lidar_misalign:0.4:2',
                                    'mixed_lie:120']
    assert study.parse_args(['--design', 'lies', '--quick']).work_dir == 'work_dirs/study_lies_quick'
    assert (options.image_drop, options.lidar_drop) == (0.0, 0.0)  # make demo's recipe
    # trainings: the configs' data-parallel processes, one in a quick study (its few samples train faster so)
    assert study.parse_args([]).processes is None and study.parse_args(['--quick']).processes == 1
    assert study.parse_args(['--quick', '--processes', '2']).processes == 2


def _weights(path):
    return torch.load(path, map_location='cpu')['state_dict']


@pytest.mark.slow(seconds=250)
def test_quick_study_trains_evaluates_and_reports_every_arm(tmp_path, capsys):
    work, data = tmp_path / 'work', tmp_path / 'data'
    argv = ['--quick', '--work-dir', str(work), '--data-root', str(data)]
    summary = study.main(argv)
    out = capsys.readouterr().out
    assert '[study] plan: seeds 0 x 7 arms' in out
    assert out.count('$ tools/train.py ') == 6 and 'torch.distributed.run' not in out  # --quick: one process each
    report = work / 'report'
    text = (report / 'study.md').read_text()
    corruptions = list(study.QUICK_CORRUPTIONS['failures'])
    assert list(summary) == corruptions
    for metric in METRICS:
        if metric.key == 'ghost_false_positives_per_sample':
            assert f'## {metric.title}' not in text  # no ghost under these corruptions: no table
            continue
        table = text.split(f'## {metric.title}\n\n')[1].split('\n\n')[0].splitlines()
        with_values = [corruption for corruption in corruptions
                       if any(stats[metric.key] is not None for stats in summary[corruption]['arms'].values())]
        assert [line.split(' | ')[0].lstrip('| ') for line in table[2:]] == with_values
        assert metric.key != 'mAP' or with_values == corruptions
        assert all(len(line.split(' | ')) == 1 + len(STUDY_ARMS) for line in table[2:])
    written = json.loads((report / 'study.json').read_text())
    for corruption in corruptions:
        row = written['summary'][corruption]
        for arm in STUDY_ARMS:
            (run, ) = written['runs'][arm.name]
            assert run[corruption]['status'] == 'ok', (arm.name, corruption)
            assert 0.0 <= row['arms'][arm.name]['mAP']['mean'] <= 1.0
            assert row['arms'][arm.name]['false_positives_per_sample']['mean'] >= 0.0
            # every arm but the camera-only model has AQR modules (stage 1's frozen): the router is scored against
            # the targets
            accuracy = row['arms'][arm.name]['router_accuracy']
            assert accuracy is None if arm.name == 'camera_only' else 0.0 <= accuracy['mean'] <= 1.0
            if arm.name != 'control':
                difference = row['minus_control'][arm.name]['mAP']
                (control, ) = written['runs']['control']
                assert difference['mean'] == pytest.approx(run[corruption]['mAP'] - control[corruption]['mAP'])
    assert written['summary']['clean']['arms']['aqr_targets']['affected_recall'] is None  # clean affects nothing
    (oracle, ) = written['runs']['oracle']
    assert oracle['lidar_drop']['routing'] == 'oracle'
    assert oracle['lidar_drop']['objects']['counts']['lidar_affected'] > 0
    assert (report / 'study_chart.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    for tag in ('object_drop_0p5', 'mixed_120'):
        for kind in ('bev', 'cameras', 'bias'):
            assert (report / f'study_{tag}_{kind}.png').exists() and f'(study_{tag}_{kind}.png)' in text

    # stage 2 started from stage 1: the routing arms changed the detector and their AQR modules, the control
    # changed the detector itself and left the (frozen) AQR modules alone
    seed = work / 'seed0'
    stage1 = _weights(seed / 'stage1' / 'epoch_2.pth')
    aqr_keys = {key for key in stage1 if key.startswith(AQR_PREFIXES)}
    assert aqr_keys
    for name in ROUTING_ARMS:
        weights = _weights(seed / name / 'epoch_1.pth')
        changed = {key for key, value in stage1.items() if not torch.equal(weights[key], value)}
        assert set(weights) == set(stage1) and changed & aqr_keys and changed - aqr_keys, name
    control = _weights(seed / 'control' / 'epoch_1.pth')
    changed = {key for key, value in stage1.items() if not torch.equal(control[key], value)}
    assert changed and not changed & aqr_keys
    config = (seed / 'aqr_targets' / 'cmt_aqr_synthetic_tiny_passes.py').read_text()
    assert 'RandomSensorCorruption' in config and 'query_loss_weight=1.0' in config
    assert 'RandomSensorCorruption' in (seed / 'control' / 'cmt_aqr_synthetic_tiny_passes_fixed_routing.py').read_text()

    study.main(argv)  # a second run reuses every step
    out = capsys.readouterr().out
    assert out.count('exists') == 6 and out.count('has every corruption') == 7 and '$ ' not in out
