"""tools/demo.py (``make demo``) end to end on a tiny synthetic set, and the work dirs it refuses."""
import json

import pytest

from projects.mmdet3d_plugin.experiments.demo_pipeline import METRIC_PREFIX
from tools import demo


@pytest.mark.slow(seconds=120)
def test_demo_runs_every_step_and_reuses_its_outputs(tmp_path, capsys):
    data_root, work_dir = tmp_path / 'data', tmp_path / 'work'
    argv = ['--model', 'cmt_aqr', '--data-root', str(data_root), '--work-dir', str(work_dir), '--scenes', '2',
            '--samples', '2', '--epochs', '1', '--sensor-failure-epochs', '1', '--processes', '1']
    demo.main(argv)
    out = capsys.readouterr().out
    assert out.count('$ tools/train.py ') == 2  # --processes 1 (two processes: tests/tools/test_dist_train*.py)
    assert '[demo 5/6] fine-tuning it on sensor failures for 1 epochs' in out and '[demo 6/6]' in out
    assert '| mAP |' in out and '| NDS |' in out
    assert (work_dir / 'latest.pth').exists() and (work_dir / 'demo_metrics.md').exists()
    config_text = (work_dir / 'cmt_aqr_synthetic_tiny_passes.py').read_text()
    assert str(data_root) in config_text and 'data/synthetic_nuscenes' not in config_text
    finetune = work_dir / 'sensor_failures'
    finetune_config = (finetune / 'cmt_aqr_synthetic_tiny_passes.py').read_text()
    assert 'RandomSensorCorruption' in finetune_config and str(work_dir / 'latest.pth') in finetune_config
    assert (finetune / 'latest.pth').exists()
    evaluation = json.loads(sorted((work_dir / 'trained').glob('eval_*.json'))[-1].read_text())
    assert 0.0 <= evaluation['metrics'][METRIC_PREFIX + 'NDS'] <= 1.0
    assert f'checkpoint:   {finetune / "latest.pth"}' in out  # the fine-tuned model is the one evaluated

    evaluations = sorted((work_dir / 'trained').glob('eval_*.json'))
    demo.main(argv)  # the second run skips every step: its outputs are there
    out = capsys.readouterr().out
    assert 'already in' in out and 'untrained model already evaluated' in out
    assert out.count('already trained: ') == 2 and 'trained model already evaluated' in out and '$ ' not in out
    assert sorted((work_dir / 'trained').glob('eval_*.json')) == evaluations
    assert '| mAP |' in out

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
