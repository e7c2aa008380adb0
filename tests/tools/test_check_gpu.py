"""tools/check_gpu.py in its CPU mode (tiny shapes): passes, names the failing case when a check fails, and reports
a training step that raises (traceback, summary, exit status) instead of crashing."""
import pytest
import torch

from projects.mmdet3d_plugin.diagnostics import gpu_check, training_check
from projects.mmdet3d_plugin.utils.host_data import permitted_host_sync
from tools import check_gpu

QUICK = ['--device', 'cpu', '--steps', '3', '--repeats', '1']


def test_cpu_self_check_passes(capsys):
    assert check_gpu.main(QUICK) == 0
    out = capsys.readouterr().out
    assert 'check_gpu passed' in out
    assert '| quick | float32 | both | auto | ok |' in out
    assert 'demo model training: 3 iterations, ground-truth boxes per batch [1, 3, 4]' in out
    assert '0 compiled graphs, 0 eager-flex warnings' in out
    assert out.count('alpha gradient') == 2 and 'FAILED' not in out
    assert 'x bias-free SDPA' in out


def test_the_training_check_runs_the_cross_attention_in_the_dtype_asked(capsys):
    """``--attention-dtype``: the demo model's cross-attention in that dtype, stated in the training line; the CPU
    default (``'auto'``) is float32; an unknown value is refused by the parser."""
    quick = QUICK + ['--dtypes', 'float32', '--skip-benchmark', '--steps', '1']
    assert check_gpu.main(quick + ['--attention-dtype', 'bfloat16']) == 0
    line = [line for line in capsys.readouterr().out.splitlines() if line.startswith('demo model training')][0]
    assert ' bfloat16' in line.split('cross-attention ')[1].split(', ops')[0] and 'float32' not in line
    assert check_gpu.main(quick) == 0
    line = [line for line in capsys.readouterr().out.splitlines() if line.startswith('demo model training')][0]
    assert 'cross-attention ' in line and 'bfloat16' not in line and ' float32' in line
    with pytest.raises(SystemExit):
        check_gpu.parse_args(['--device', 'cpu', '--attention-dtype', 'fp16'])


def test_a_cross_attention_in_another_dtype_than_asked_fails_the_training_check(capsys, monkeypatch):
    """The check compares what ran with what was asked: a cross-attention that ignores the option fails it."""
    from projects.mmdet3d_plugin.models.utils import petr_attention
    monkeypatch.setattr(petr_attention.BiasedMultiheadAttention, 'compute_dtype', lambda self, q: q.dtype)
    assert check_gpu.main(QUICK + ['--dtypes', 'float32', '--skip-benchmark', '--steps', '1',
                                   '--attention-dtype', 'bfloat16']) == 1
    assert "training: the cross-attention ran in ['float32'], not bfloat16" in capsys.readouterr().out


def test_cpu_self_check_fails_and_names_the_case(capsys, monkeypatch):
    monkeypatch.setitem(gpu_check.TOLERANCES, 'float32', (0.0, 0.0))
    monkeypatch.setattr(gpu_check, 'FLOOR_FACTOR', 0.0)
    assert check_gpu.main(QUICK + ['--dtypes', 'float32', '--skip-benchmark']) == 1
    out = capsys.readouterr().out
    assert 'check_gpu FAILED' in out
    assert 'accuracy quick float32 global segment: FAILED: out' in out


def test_a_failing_training_step_is_reported_with_its_traceback(capsys, monkeypatch):
    def failing_step(model, update, batch, device):
        raise RuntimeError('injected failure of the training step')

    monkeypatch.setattr(training_check, 'run_train_step', failing_step)
    assert check_gpu.main(QUICK + ['--dtypes', 'float32', '--skip-benchmark']) == 1
    out = capsys.readouterr().out
    assert out.count('Traceback (most recent call last)') == 3  # one per step, each step still runs
    assert 'in failing_step' in out and 'RuntimeError: injected failure of the training step' in out
    assert 'demo model training: 3 iterations (3 failed)' in out and 'loss n/a (no step finished)' in out
    summary = out.split('check_gpu FAILED (3 cases):', 1)[1]
    assert 'check_gpu passed' not in out
    for step in range(3):
        assert f'training: step {step} failed: RuntimeError: injected failure of the training step' in summary


def test_a_check_that_raises_is_reported_and_the_others_still_run(capsys, monkeypatch):
    def broken(options):
        raise ValueError('the alpha check broke')

    monkeypatch.setattr(gpu_check, 'check_alpha_gradients', broken)
    assert check_gpu.main(QUICK + ['--dtypes', 'float32', '--skip-benchmark', '--steps', '1']) == 1
    out = capsys.readouterr().out
    assert 'alpha gradient check raised:\nTraceback (most recent call last)' in out
    assert 'demo model training: 1 iterations' in out  # the training check ran after it
    assert out.rstrip().endswith('alpha gradient: ValueError: the alpha check broke')


def test_an_op_that_would_wait_on_cuda_fails_the_cpu_training_check(capsys, monkeypatch):
    """A boolean-mask index in the forward (its backward runs nonzero: a host sync on CUDA) fails the CPU check,
    which names the op and the forward line that made it."""
    from projects.mmdet3d_plugin.models.middle_encoders import BatchPillarScatter

    scatter = BatchPillarScatter.forward

    def forward_with_mask(self, voxel_features, coors, batch_size=None):
        keep = voxel_features.new_ones(len(voxel_features), dtype=torch.bool)
        with permitted_host_sync():  # the forward may wait; its backward runs outside the region
            voxel_features, coors = voxel_features[keep], coors[keep]
        return scatter(self, voxel_features, coors, batch_size)

    monkeypatch.setattr(BatchPillarScatter, 'forward', forward_with_mask)
    assert check_gpu.main(QUICK + ['--dtypes', 'float32', '--skip-benchmark', '--steps', '1']) == 1
    out = capsys.readouterr().out
    assert 'SyncingOpsError: 1 ops that wait for the device on CUDA ran outside permitted_host_sync' in out
    assert 'aten.index_put.default [boolean index] at File' in out and 'in forward_with_mask' in out
    assert 'training: step 0: 1 ops that wait for the device on CUDA' in out.split('check_gpu FAILED', 1)[1]
