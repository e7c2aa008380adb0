"""tools/demo.py (``make demo``) end to end on a tiny synthetic set, and its metrics table."""
import json

import pytest

from tools import demo


def test_metrics_table_lists_summary_metrics_and_class_aps_per_model():
    prefix = demo.METRIC_PREFIX
    untrained = {prefix + 'mAP': 0.0, prefix + 'NDS': 0.01, prefix + 'car_AP_dist_2.0': 0.0}
    trained = {prefix + 'mAP': 0.4213, prefix + 'NDS': 0.5, prefix + 'car_AP_dist_2.0': 0.9}
    table = demo.metrics_table({'untrained': untrained, 'trained': trained}, ['car', 'bus']).splitlines()
    assert table[0] == '| metric | untrained | trained |'
    assert '| mAP | 0.0000 | 0.4213 |' in table and '| AP car (2 m) | 0.0000 | 0.9000 |' in table
    assert not any('bus' in row or 'mATE' in row for row in table)  # rows nobody reported are left out


@pytest.mark.slow(seconds=120)
def test_demo_runs_every_step_and_reuses_its_outputs(tmp_path, capsys):
    data_root, work_dir = tmp_path / 'data', tmp_path / 'work'
    argv = ['--model', 'cmt_aqr', '--data-root', str(data_root), '--work-dir', str(work_dir), '--scenes', '2',
            '--samples', '2', '--epochs', '1']
    demo.main(argv)
    out = capsys.readouterr().out
    assert '[demo 5/5]' in out and '| mAP |' in out and '| NDS |' in out
    assert (work_dir / 'latest.pth').exists() and (work_dir / 'demo_metrics.md').exists()
    config_text = (work_dir / 'cmt_aqr_synthetic_tiny_passes.py').read_text()
    assert str(data_root) in config_text and 'data/synthetic_nuscenes' not in config_text
    metrics = json.loads(sorted((work_dir / 'trained').glob('eval_*.json'))[-1].read_text())['metrics']
    assert 0.0 <= metrics[demo.METRIC_PREFIX + 'NDS'] <= 1.0

    demo.main(argv)  # the second run skips data generation and the untrained evaluation
    out = capsys.readouterr().out
    assert 'already in' in out and 'untrained model already evaluated' in out

    # another dataset (seed) must not resume this work dir's checkpoints; nothing is regenerated or overwritten
    stamp = (data_root / '.demo_dataset.json').read_text()
    with pytest.raises(SystemExit, match='another config or dataset'):
        demo.main(argv + ['--seed', '1'])
    assert (data_root / '.demo_dataset.json').read_text() == stamp


def test_demo_refuses_a_work_dir_of_an_unmarked_earlier_run(tmp_path):
    work_dir = tmp_path / 'old'
    work_dir.mkdir()
    (work_dir / 'latest.pth').write_bytes(b'')
    with pytest.raises(SystemExit, match='earlier run'):
        demo.main(['--data-root', str(tmp_path / 'data'), '--work-dir', str(work_dir)])
    assert list((tmp_path / 'data').iterdir()) == []  # nothing generated


@pytest.mark.parametrize('requested, config_processes, cores, has_gpu, expected', [
    (None, 2, 2, False, 2),  # a 2-core laptop: the config's two single-threaded processes
    (None, 2, 16, False, 2),
    (None, 1, 16, False, 1),  # a config written for one process
    (None, 2, 1, False, 1),  # one core: nothing to share
    (None, 2, 8, True, 1),  # one process drives the GPU
    (1, 2, 8, False, 1),
    (3, 2, 1, False, 3),
])
def test_training_processes_follow_the_config_on_cpu_machines_only(requested, config_processes, cores, has_gpu,
                                                                   expected):
    assert demo.training_processes(requested, config_processes, cores, has_gpu) == expected


def test_training_processes_refuse_a_count_below_one():
    with pytest.raises(SystemExit, match='--processes must be >= 1'):
        demo.training_processes(0, 2, 8, False)


def test_train_command_launches_data_parallel_processes_with_the_cores_split_between_them():
    arguments = ['cfg.py', '--work-dir', 'w']
    assert demo.train_command(arguments, 1, 8) == (['tools/train.py'] + arguments, {})
    command, env = demo.train_command(arguments, 2, 8)
    assert command[:2] == ['-m', 'torch.distributed.run']
    assert command[command.index('--nproc_per_node') + 1] == '2'
    assert command[command.index('tools/train.py'):] == ['tools/train.py', '--launcher', 'pytorch'] + arguments
    assert env == dict(OMP_NUM_THREADS='4', MKL_NUM_THREADS='4')
    assert demo.train_command(arguments, 2, 3)[1]['OMP_NUM_THREADS'] == '1'
