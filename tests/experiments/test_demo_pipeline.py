"""experiments/demo_pipeline.py: the metrics table, the fine-tune on sensor failures and which finished steps a
second run skips."""
import json
import os

import pytest

from projects.mmdet3d_plugin.datasets.corruption_config import SENSOR_FAILURE_CORRUPTIONS
from projects.mmdet3d_plugin.experiments import demo_pipeline
from projects.mmdet3d_plugin.experiments.demo_pipeline import (METRIC_PREFIX, SENSOR_FAILURE_EPOCHS,
                                                               SENSOR_FAILURE_LR_SCALE, demo_config, fine_tune_epochs,
                                                               latest_metrics, metrics_table, sensor_failure_config,
                                                               train)


def test_metrics_table_lists_summary_metrics_and_class_aps_per_model():
    prefix = METRIC_PREFIX
    untrained = {prefix + 'mAP': 0.0, prefix + 'NDS': 0.01, prefix + 'car_AP_dist_2.0': 0.0}
    trained = {prefix + 'mAP': 0.4213, prefix + 'NDS': 0.5, prefix + 'car_AP_dist_2.0': 0.9}
    table = metrics_table({'untrained': untrained, 'trained': trained}, ['car', 'bus']).splitlines()
    assert table[0] == '| metric | untrained | trained |'
    assert '| mAP | 0.0000 | 0.4213 |' in table and '| AP car (2 m) | 0.0000 | 0.9000 |' in table
    assert not any('bus' in row or 'mATE' in row for row in table)  # rows nobody reported are left out


def test_the_sensor_failure_fine_tune_trains_the_demo_config_on_failures_from_its_checkpoint(tmp_path):
    cfg = demo_config('cmt_aqr', str(tmp_path))
    finetune = sensor_failure_config(cfg, 4, 'work/latest.pth')
    assert (finetune.runner.max_epochs, finetune.load_from) == (4, 'work/latest.pth')
    types = [step['type'] for step in finetune.data.train.pipeline]
    assert types[types.index('RandomSensorCorruption') + 1] == 'ModalMask3D'
    step = finetune.data.train.pipeline[types.index('RandomSensorCorruption')]
    assert step['corruptions'] == [dict(item) for item in SENSOR_FAILURE_CORRUPTIONS]
    # the demo's own config is left as it was; everything but the training pipeline, epochs, start and rate is the same
    assert 'RandomSensorCorruption' not in [step['type'] for step in cfg.data.train.pipeline]
    assert cfg.runner.max_epochs == 12 and cfg.get('load_from') is None
    assert cfg.optimizer.lr == 1.4e-3 and 0 < SENSOR_FAILURE_LR_SCALE < 1
    assert finetune.optimizer.lr == pytest.approx(cfg.optimizer.lr * SENSOR_FAILURE_LR_SCALE)
    assert {key: value for key, value in finetune.optimizer.items() if key != 'lr'} == {
        key: value for key, value in cfg.optimizer.items() if key != 'lr'}
    assert finetune.model == cfg.model and finetune.data.test == cfg.data.test and finetune.lr_config == cfg.lr_config


def test_only_cmt_aqr_fine_tunes_on_sensor_failures_by_default_and_a_negative_count_is_refused():
    assert [fine_tune_epochs(model, None) for model in ('cmt_aqr', 'cmt_aqr_heading', 'cmt_aqr_fused', 'cmt',
                                                        'cmt_camera')] == [SENSOR_FAILURE_EPOCHS['cmt_aqr']] * 2 + [0] * 3
    assert SENSOR_FAILURE_EPOCHS['cmt_aqr'] == 4
    assert fine_tune_epochs('cmt_aqr', 0) == 0 and fine_tune_epochs('cmt', 2) == 2
    with pytest.raises(SystemExit, match='--sensor-failure-epochs must be >= 0'):
        fine_tune_epochs('cmt_aqr', -1)


def test_a_front_intensity_offset_is_a_generator_option_of_the_heading_models_data_only():
    plain = demo_pipeline.DemoDataset('data/x', 100, 2, 0, '3')
    bright = demo_pipeline.DemoDataset('data/x', 100, 2, 0, '3', front_intensity_offset=40.0)
    assert '--front-intensity-offset' not in plain.generator_arguments(), 'the default sets keep their stamp'
    assert bright.generator_arguments() == plain.generator_arguments() + ['--front-intensity-offset', '40.0']
    assert bright.stamp() != plain.stamp()
    assert demo_pipeline.FRONT_INTENSITY_OFFSETS == dict(cmt_aqr_heading=40.0)
    assert set(demo_pipeline.FRONT_INTENSITY_OFFSETS) <= set(demo_pipeline.CONFIGS)


def test_latest_metrics_are_of_the_newest_evaluation_and_not_older_than_the_checkpoint(tmp_path):
    checkpoint = tmp_path / 'epoch_1.pth'
    checkpoint.write_bytes(b'')
    assert latest_metrics(str(tmp_path)) is None
    for name, value in (('eval_20261128_100000.json', 0.1), ('eval_20261128_110000.json', 0.2)):
        (tmp_path / name).write_text(json.dumps({'metrics': {'mAP': value}}))
    os.utime(checkpoint, (1000, 1000))
    assert latest_metrics(str(tmp_path)) == {'mAP': 0.2}
    assert latest_metrics(str(tmp_path), newer_than=str(checkpoint)) == {'mAP': 0.2}
    os.utime(checkpoint)  # the checkpoint written after the evaluation (a longer fine-tune): evaluate it again
    os.utime(tmp_path / 'eval_20261128_110000.json', (1000, 1000))
    assert latest_metrics(str(tmp_path), newer_than=str(checkpoint)) is None


def test_a_training_whose_last_epoch_is_saved_is_not_started_again(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(demo_pipeline, 'REPO_ROOT', str(tmp_path))
    monkeypatch.setattr(demo_pipeline, 'run_tool', lambda command, env=None: started.append(command))
    (tmp_path / 'work').mkdir()
    (tmp_path / 'work' / 'epoch_1.pth').write_bytes(b'')
    train('work/demo.py', 'work', 2, 0, [], 1, 2)  # epoch 1 of 2: resume
    assert started == [['tools/train.py', 'work/demo.py', '--work-dir', 'work', '--auto-resume', '--no-validate',
                        '--seed', '0']]
    train('work/demo.py', 'work', 1, 0, [], 1, 2)
    assert len(started) == 1 and 'already trained: work/epoch_1.pth' in capsys.readouterr().out
