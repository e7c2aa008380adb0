"""tools/eval_robustness.py: every corruption evaluated by the nuScenes devkit, failures reported, tables written;
evaluation on the first N samples (the devkit's ground truth narrowed to them)."""
import json

import pytest
import torch
from mmcv import Config

from projects.mmdet3d_plugin.apis.sample_subset import keep_first_samples, nuscenes_ground_truth_of
from projects.mmdet3d_plugin.apis.test import evaluate_results, nuscenes_scores
from tools import eval_robustness

AQR_DEMO = 'cmt_aqr_synthetic_tiny'


def _table_rows(markdown: str):
    """Cells of the table rows (header and separator skipped) of a Markdown report."""
    lines = [line for line in markdown.splitlines() if line.startswith('|')]
    return [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[2:]]


def test_every_corruption_is_evaluated_and_a_failing_one_is_reported(demo_checkpoint, tmp_path):
    config, checkpoint = demo_checkpoint(AQR_DEMO)
    corruptions = ['clean', 'camera_drop', 'view_drop:9', 'points:0.5']  # the samples have 6 views: view 9 fails
    results = eval_robustness.main([config, checkpoint, '--corruptions', *corruptions, '--out', str(tmp_path),
                                    '--samples', '1'])
    assert [r.corruption for r in results] == corruptions
    assert [r.status for r in results] == ['ok', 'ok', 'failed', 'ok']
    assert 'the sample has 6 camera views' in results[2].error and results[2].mAP is None

    report = json.loads((tmp_path / 'robustness.json').read_text())
    assert report['samples'] == 1 and report['checkpoint'] == checkpoint
    rows = {row['corruption']: row for row in report['results']}
    assert list(rows) == corruptions
    for name in ('clean', 'camera_drop', 'points:0.5'):
        row = rows[name]
        assert 0.0 <= row['mAP'] <= 1.0 and 0.0 <= row['NDS'] <= 1.0
        assert row['delta_NDS'] == pytest.approx(row['NDS'] - rows['clean']['NDS'])
    assert rows['view_drop:9']['delta_NDS'] is None and 'ValueError' in rows['view_drop:9']['error']

    table = {cells[0]: cells for cells in _table_rows((tmp_path / 'robustness.md').read_text())}
    assert list(table) == corruptions
    for name in ('clean', 'camera_drop', 'points:0.5'):
        assert [float(cell) for cell in table[name][1:5]] == pytest.approx(
            [rows[name][key] for key in ('mAP', 'NDS', 'delta_mAP', 'delta_NDS')], abs=1e-4)
        assert table[name][5] == 'ok'
    assert table['view_drop:9'][1:5] == ['n/a'] * 4 and table['view_drop:9'][5].startswith('failed: ValueError')


def test_default_corruptions_and_bad_specs(capsys):
    args = eval_robustness.parse_args(['config.py', 'checkpoint.pth'])
    assert args.corruptions == ['clean', 'lidar_drop', 'camera_drop', 'view_drop:0', 'fov:120', 'beams:16',
                                'points:0.1', 'object_drop:0.5', 'camera_fail:0.4', 'extrinsic:2', 'mixed:120']
    with pytest.raises(SystemExit):
        eval_robustness.parse_args(['config.py', 'checkpoint.pth', '--corruptions', 'clean', 'rain'])
    assert "unknown corruption mode 'rain'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_robustness.parse_args(['config.py', 'checkpoint.pth', '--corruptions', 'clean', 'clean'])
    assert 'more than once' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_robustness.parse_args(['config.py', 'checkpoint.pth', '--attention-mass'])
    assert '--attention-mass is an object metric: add --object-metrics' in capsys.readouterr().err


def test_attention_mass_on_the_dead_sensor(demo_checkpoint, tmp_path):
    config, checkpoint = demo_checkpoint(AQR_DEMO)
    results = eval_robustness.main([config, checkpoint, '--corruptions', 'clean', 'camera_drop', '--object-metrics',
                                    '--attention-mass', '--out', str(tmp_path), '--samples', '2'])
    assert all(r.status == 'ok' for r in results), [r.error for r in results]
    dead_camera = results[1].objects
    assert dead_camera['counts']['dead_camera_objects'] > 0 and 0.0 <= dead_camera['dead_camera_attention'] <= 1.0
    assert results[0].objects['dead_lidar_attention'] is None or 0.0 <= results[0].objects['dead_lidar_attention'] <= 1


def test_first_samples_are_evaluated_against_their_own_ground_truth(demo_checkpoint):
    """Ground-truth boxes as predictions of the first sample: the devkit matches them all (only with the narrowing)."""
    from mmdet3d.datasets import build_dataset
    config, _ = demo_checkpoint(AQR_DEMO)
    cfg = Config.fromfile(config)
    dataset = build_dataset(cfg.data.test)
    tokens = keep_first_samples(dataset, 1)
    assert len(dataset) == 1 and tokens == [dataset.data_infos[0]['token']]
    annotations = dataset.get_ann_info(0)
    known = annotations['gt_labels_3d'] >= 0
    outputs = [dict(pts_bbox=dict(boxes_3d=annotations['gt_bboxes_3d'][torch.from_numpy(known)],
                                  scores_3d=torch.ones(int(known.sum())),
                                  labels_3d=torch.from_numpy(annotations['gt_labels_3d'][known])))]
    with pytest.raises(AssertionError, match="Samples in split doesn't match"):
        evaluate_results(dataset, outputs, cfg, ['bbox'])
    with nuscenes_ground_truth_of(tokens):
        metrics = evaluate_results(dataset, outputs, cfg, ['bbox'])
    # every class is matched perfectly (AP 1) or has no box within its evaluation range (AP 0)
    present = {dataset.CLASSES[label] for label in annotations['gt_labels_3d'][known]}
    aps = {name: metrics[f'pts_bbox_NuScenes/{name}_AP_dist_0.5'] for name in dataset.CLASSES}
    perfect = {name for name, ap in aps.items() if ap == pytest.approx(1.0, abs=0.02)}
    assert perfect and perfect <= present
    assert all(ap == pytest.approx(0.0) for name, ap in aps.items() if name not in perfect)
    assert nuscenes_scores(metrics)['mAP'] == pytest.approx(len(perfect) / len(dataset.CLASSES), abs=0.02)
    assert keep_first_samples(dataset, 5) is None  # not below the length: nothing cut


def test_learned_and_oracle_routing_are_evaluated_side_by_side(demo_checkpoint, tmp_path):
    config, checkpoint = demo_checkpoint(AQR_DEMO)
    results = eval_robustness.main([config, checkpoint, '--corruptions', 'clean', 'lidar_drop', '--routing', 'learned',
                                    'oracle', '--out', str(tmp_path), '--samples', '1'])
    assert [(r.corruption, r.routing) for r in results] == [('clean', 'learned'), ('clean', 'oracle'),
                                                             ('lidar_drop', 'learned'), ('lidar_drop', 'oracle')]
    assert all(r.status == 'ok' for r in results), [r.error for r in results]
    assert results[3].delta_mAP == pytest.approx(results[3].mAP - results[1].mAP), 'deltas against the same routing'
    rows = _table_rows((tmp_path / 'robustness.md').read_text())
    assert [row[:2] for row in rows] == [['clean', 'learned'], ['clean', 'oracle'], ['lidar_drop', 'learned'],
                                         ['lidar_drop', 'oracle']]


def test_oracle_routing_needs_an_aqr_model(demo_checkpoint, tmp_path):
    config, checkpoint = demo_checkpoint('cmt_synthetic_tiny')
    with pytest.raises(ValueError, match='needs a CMT-AQR model'):
        eval_robustness.main([config, checkpoint, '--corruptions', 'clean', '--routing', 'oracle', '--out',
                              str(tmp_path), '--samples', '1'])
