"""experiments/study_report.py: the seeds' spread, paired differences from the control, tables and chart."""
import copy

import pytest

from projects.mmdet3d_plugin.experiments.study_arms import study_arm
from projects.mmdet3d_plugin.experiments.study_report import (bar_chart, cell, degradation_lines, markdown_report,
                                                       metric_tables, paired_difference, per_seed_lines, summarise)


def _result(mAP, recall=None, status='ok'):
    if status != 'ok':
        return dict(status=status, error='RuntimeError: x')
    objects = dict(affected_recall=recall, false_positives_per_sample=1.5, router_accuracy=None)
    return dict(status='ok', mAP=mAP, NDS=mAP / 2, objects=objects)


def _runs():
    # three seeds; aqr_targets' seed 2 failed
    return dict(control=[{'clean': _result(0.40, 0.5)}, {'clean': _result(0.10, 0.7)}, {'clean': _result(0.30)}],
                aqr_targets=[{'clean': _result(0.50, 0.6)}, {'clean': _result(0.20, 0.6)},
                             {'clean': _result(0, status='x')}],
                stage1=[{'clean': _result(0.30, 0.6)}, {'clean': _result(0.20, 0.6)}, {'clean': _result(0.35)}])


def test_summary_has_each_arms_spread_and_paired_differences_from_the_control():
    row = summarise(_runs(), ['clean'])['clean']
    assert row['arms']['control']['mAP'] == dict(mean=pytest.approx(0.8 / 3), min=0.10, max=0.40, n=3)
    assert row['arms']['aqr_targets']['mAP'] == dict(mean=pytest.approx(0.35), min=0.20, max=0.50, n=2)
    assert row['arms']['control']['affected_recall']['n'] == 2  # seed 2 has no affected objects
    assert row['arms']['aqr_targets']['router_accuracy'] is None
    assert row['arms']['aqr_targets']['false_positives_per_sample']['mean'] == 1.5
    # paired by seed, the failed seed left out: +0.1 and +0.1
    aqr = row['minus_control']['aqr_targets']['mAP']
    assert (aqr['mean'], aqr['n'], aqr['same_sign']) == (pytest.approx(0.1), 2, True)
    stage1 = row['minus_control']['stage1']['mAP']  # -0.1, +0.1, +0.05: the sign flips
    assert (stage1['min'], stage1['max'], stage1['n'], stage1['same_sign']) == (
        pytest.approx(-0.1), pytest.approx(0.1), 3, False)
    assert 'control' not in row['minus_control']
    assert row['minus_control']['aqr_targets']['affected_recall']['mean'] == pytest.approx(0.0)
    assert row['minus_control']['aqr_targets']['affected_recall']['same_sign'] is False  # +0.1 and -0.1


def test_paired_difference_skips_missing_seeds_and_zero_has_no_sign():
    assert paired_difference([0.2, None, 0.1], [0.1, 0.3, None]) == dict(mean=pytest.approx(0.1), min=pytest.approx(0.1),
                                                                         max=pytest.approx(0.1), n=1, same_sign=True)
    assert paired_difference([0.1, 0.1], [0.1, 0.0])['same_sign'] is False
    assert paired_difference([None], [0.1]) is None


def test_summary_needs_the_control_and_a_run_per_seed():
    runs = _runs()
    with pytest.raises(ValueError, match='reference arm'):
        summarise({'aqr_targets': runs['aqr_targets']}, ['clean'])
    with pytest.raises(ValueError, match='one run per seed'):
        summarise(dict(runs, aqr_targets=runs['aqr_targets'][:2]), ['clean'])


def test_cells_and_tables():
    assert cell(None) == 'n/a'
    assert cell(dict(mean=0.25, min=0.1, max=0.4, n=3)) == '0.250 (0.100 … 0.400)'
    assert cell(dict(mean=0.25, min=0.25, max=0.25, n=1)) == '0.250'
    assert cell(dict(mean=0.02, min=0.01, max=0.03, n=3, same_sign=True), signed=True) == \
        '**+0.020** (+0.010 … +0.030)'
    assert cell(dict(mean=-0.0001, min=-0.01, max=0.01, n=2, same_sign=False), signed=True) == \
        '+0.000 (-0.010 … +0.010)'
    arms = [study_arm('stage1'), study_arm('control'), study_arm('aqr_targets')]
    lines = metric_tables(summarise(_runs(), ['clean']), arms)
    headers = [line for line in lines if line.startswith('| corruption | stage 1')]
    assert headers == ['| corruption | stage 1 | control | CMT-AQR |', '| corruption | stage 1 − control | '
                       'CMT-AQR − control |'] * 4  # one pair of tables per metric with a value
    map_rows = [line for line in lines if line.startswith('| clean |')][:2]
    assert map_rows[0] == '| clean | 0.283 (0.200 … 0.350) | 0.267 (0.100 … 0.400) | 0.350 (0.200 … 0.500) |'
    assert map_rows[1] == '| clean | +0.017 (-0.100 … +0.100) | **+0.100** (+0.100 … +0.100) |'
    titles = [line for line in lines if line.startswith('## ')]
    assert titles == ['## mAP', '## NDS', '## recall at 2 m of the affected objects', '## false positives per sample']
    runs = _runs()
    for seed in runs.values():
        seed[0]['lidar_ghost:3'] = copy.deepcopy(seed[1]['clean'])
    runs['control'][0]['lidar_ghost:3']['objects']['ghost_false_positives_per_sample'] = 0.25
    lines = metric_tables(summarise(runs, ['clean', 'lidar_ghost:3']), arms)
    ghosts = lines[lines.index('## false positives per sample within 2 m of a ghost'):]
    assert '| lidar_ghost:3 | n/a | 0.250 | n/a |' in ghosts
    assert not any(line.startswith('| clean |') for line in ghosts), 'a corruption without ghosts gets no row'


def test_report_and_chart(tmp_path):
    arms = [study_arm('control'), study_arm('aqr_targets')]
    summary = summarise({arm: runs for arm, runs in _runs().items() if arm != 'stage1'}, ['clean'])
    bar_chart(summary, arms, str(tmp_path / 'chart.png'))
    assert (tmp_path / 'chart.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    shared = [{'clean': _result(0.1)}] * 3  # a shared stage 1: its mean rounds above its equal values
    bar_chart(summarise(dict(control=shared, aqr_targets=shared), ['clean']), arms, str(tmp_path / 'shared.png'))
    text = markdown_report('Title', ['setup'], summary, arms, 'chart.png', {'mixed:120': ['study_mixed_120_bev.png']},
                           'caption')
    assert text.startswith('# Title\n\nsetup\n\n## mAP')
    assert '](chart.png)' in text and '### mixed:120\n\n![mixed:120: study_mixed_120_bev.png](study_mixed_120_bev.png)' \
        in text and 'caption' in text
    assert 'caption' not in markdown_report('Title', [], summary, arms, 'chart.png', {}, 'caption')


def test_degradation_compares_each_two_sensor_arm_with_the_surviving_sensors_model():
    def seed(clean, lidar_drop, camera_drop):
        return {'clean': _result(clean), 'lidar_drop': _result(lidar_drop), 'camera_drop': _result(camera_drop)}

    runs = dict(lidar_only=[seed(0.45, 0.0, 0.48), seed(0.44, 0.0, 0.46)],
                camera_only=[seed(0.20, 0.20, 0.0), seed(0.24, 0.24, 0.0)],
                control=[seed(0.60, 0.15, 0.37), seed(0.58, 0.16, 0.38)],
                aqr_targets=[seed(0.60, 0.21, 0.47), seed(0.58, 0.25, 0.47)])
    arms = [study_arm(name) for name in ('lidar_only', 'camera_only', 'control', 'aqr_targets')]
    lines = degradation_lines(runs, arms)
    assert lines[0] == '## Graceful degradation'
    assert '| arm | camera_drop − LiDAR only | lidar_drop − camera only |' in lines
    # camera_drop against the LiDAR-only model under camera_drop; lidar_drop against the camera-only model clean
    assert '| control | **-0.095** (-0.110 … -0.080) | **-0.065** (-0.080 … -0.050) |' in lines
    assert '| CMT-AQR | +0.000 (-0.010 … +0.010) | **+0.010** (+0.010 … +0.010) |' in lines
    assert not any(line.startswith('| LiDAR only') or line.startswith('| camera only') for line in lines)
    assert degradation_lines({name: runs[name] for name in ('control', 'aqr_targets')}, arms) == []


def test_the_per_seed_table_lists_every_seeds_map():
    arms = [study_arm('stage1'), study_arm('control'), study_arm('aqr_targets')]
    lines = per_seed_lines(_runs(), arms, [0, 1, 2])
    assert lines[:3] == ['## mAP per seed', '', 'Seeds 0 / 1 / 2 (`n/a`: the run failed).']
    assert '| clean | 0.300 / 0.200 / 0.350 | 0.400 / 0.100 / 0.300 | 0.500 / 0.200 / n/a |' in lines
    assert per_seed_lines(_runs(), arms, [0]) == []
    text = markdown_report('Title', [], summarise(_runs(), ['clean']), arms, 'chart.png', {}, '', per_seed=lines)
    assert text.index('## mAP per seed') < text.index('](chart.png)')
