"""tools/check_gpu.py in its CPU mode (tiny shapes): passes, names the failing case when a check fails, and reports
a training step that raises (traceback, summary, exit status) instead of crashing."""
from projects.mmdet3d_plugin.apis import gpu_check, training_check
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
