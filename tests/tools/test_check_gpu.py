"""tools/check_gpu.py in its CPU mode (tiny shapes): passes, and names the failing case when a check fails."""
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
    monkeypatch.setitem(check_gpu.TOLERANCES, 'float32', (0.0, 0.0))
    monkeypatch.setattr(check_gpu, 'FLOOR_FACTOR', 0.0)
    assert check_gpu.main(QUICK + ['--dtypes', 'float32', '--skip-benchmark']) == 1
    out = capsys.readouterr().out
    assert 'check_gpu FAILED' in out
    assert 'accuracy quick float32 global segment: FAILED: out' in out


def test_tolerance_is_never_below_pytorchs_own_error(capsys, monkeypatch):
    """A case within a multiple of bias-free SDPA's own error passes even where the dtype's tolerance is 0."""
    monkeypatch.setitem(check_gpu.TOLERANCES, 'float32', (0.0, 0.0))
    monkeypatch.setattr(check_gpu, 'FLOOR_FACTOR', 1e3)
    args = check_gpu.parse_args(['--device', 'cpu', '--dtypes', 'float32'])
    assert check_gpu.check_accuracy(args) == []
    floor = check_gpu.error_floor('quick', args.queries, 'float32', 'cpu')
    assert 0 < floor < 1e-5
    assert f'| quick | float32 | | PyTorch SDPA without bias (floor) | ' in capsys.readouterr().out
