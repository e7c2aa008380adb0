"""``tools/dist_train.sh CONFIG 2`` on the CPU (gloo) trains exactly as one process does on the same batch.

Design, chosen to be exactly comparable: the training set is cut to one sample (``load_interval=2`` of the 2
training samples of the synthetic set). mmdet's ``DistributedGroupSampler`` pads it to one sample per process,
so both processes train on that sample, with the same seed and hence the same augmentations and noise. DDP logs
the mean of the two processes' (equal) losses and steps with the mean of their (equal) gradients, which is
exactly the loss and the step of a single process on that batch. (Two processes with one sample each against
one process with both would not be exact: BatchNorm statistics and the loss normalisation depend on the batch.)
Two epochs of one iteration: the first iteration's losses, and the second's after one synchronised optimizer
step (and the gradient norm of both steps), must equal the single-process run's. Every process uses one thread
(spconv's CPU kernels are bitwise deterministic only then). mmcv's log rounds values to 5 decimals, so the
single-process values are rounded the same way.

The model: configs/demo/cmt_synthetic_tiny.py (fusion CMT) with a 16-channel ResNet-18 (tests/tools/conftest.py).
"""
import json
import sys

import pytest


@pytest.fixture(scope='module')
def one_sample_config(synthetic_nuscenes, tools_cli, tmp_path_factory) -> str:
    cfg = tools_cli.tiny_config(synthetic_nuscenes, base='demo/cmt_synthetic_tiny.py', slim=True)
    cfg.data.train.load_interval = 2
    cfg.runner.max_epochs = 2
    cfg.checkpoint_config.update(interval=2)
    path = str(tmp_path_factory.mktemp('dist_train') / 'cmt_slim_one_sample.py')
    cfg.dump(path)
    return path


def _logged_iterations(work_dir) -> list:
    """The training iterations of the run's ``.log.json`` (its first line is the run's meta)."""
    logs = sorted(work_dir.glob('*.log.json'))
    assert len(logs) == 1, logs
    return [entry for entry in map(json.loads, logs[0].read_text().splitlines()[1:]) if entry.get('mode') == 'train']


@pytest.mark.slow(seconds=25)
def test_two_gloo_processes_train_like_one_process_on_the_same_batch(one_sample_config, tools_cli, train_in_process,
                                                                     tmp_path):
    single = train_in_process([one_sample_config, '--work-dir', str(tmp_path / 'single'), '--no-validate'])
    single_logged = _logged_iterations(tmp_path / 'single')
    assert sorted(single) == [(0, 0), (1, 0)] and len(single_logged) == 2

    work_dir = tmp_path / 'ddp'
    out = tools_cli.run(['bash', 'tools/dist_train.sh', one_sample_config, '2', '--work-dir', str(work_dir),
                         '--no-validate'], timeout=400,
                        env=dict(CUDA_VISIBLE_DEVICES='', OMP_NUM_THREADS='1', PYTHON=sys.executable,
                                 PORT=str(tools_cli.free_port())))
    assert 'Distributed training: True, device: cpu' in out
    ddp_logged = _logged_iterations(work_dir)
    assert [entry['epoch'] for entry in ddp_logged] == [1, 2] and (work_dir / 'epoch_2.pth').is_file()

    for epoch, (ddp, log_vars, single_entry) in enumerate(zip(ddp_logged, (single[0, 0], single[1, 0]),
                                                              single_logged)):
        assert log_vars.keys() <= ddp.keys()
        mismatched = {key: (ddp[key], round(value, 5)) for key, value in log_vars.items()
                      if ddp[key] != round(value, 5)}
        assert not mismatched, f'epoch {epoch + 1}: DDP vs single-process losses {mismatched}'
        assert ddp['grad_norm'] == single_entry['grad_norm']
    assert single[1, 0]['loss'] != single[0, 0]['loss']  # the second iteration saw the first one's update
