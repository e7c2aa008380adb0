"""diagnostics/gpu_check.py and diagnostics/training_check.py on the CPU: the tolerance floor, and the log values
of a step read in one transfer."""
import torch

from projects.mmdet3d_plugin.diagnostics import gpu_check
from projects.mmdet3d_plugin.diagnostics.training_check import log_values


def test_tolerance_is_never_below_pytorchs_own_error(capsys, monkeypatch):
    """A case within a multiple of bias-free SDPA's own error passes even where the dtype's tolerance is 0."""
    monkeypatch.setitem(gpu_check.TOLERANCES, 'float32', (0.0, 0.0))
    monkeypatch.setattr(gpu_check, 'FLOOR_FACTOR', 1e3)
    options = gpu_check.GpuCheckOptions(device='cpu', layouts=['quick'], queries=12, dtypes=['float32'])
    assert gpu_check.check_accuracy(options) == []
    floor = gpu_check.error_floor('quick', options.queries, 'float32', 'cpu')
    assert 0 < floor < 1e-5
    assert '| quick | float32 | | PyTorch SDPA without bias (floor) | ' in capsys.readouterr().out


def test_alpha_tolerance_is_never_below_float32_maths_own_error(capsys, monkeypatch):
    """alpha's gradient sums every score: within a multiple of float32 math's own error it passes at tolerance 0,
    and fails without the floor."""
    monkeypatch.setitem(gpu_check.TOLERANCES, 'float32', (0.0, 0.0))
    options = gpu_check.GpuCheckOptions(device='cpu', layouts=['quick'], queries=12, dtypes=['float32'])
    monkeypatch.setattr(gpu_check, 'FLOOR_FACTOR', 1e3)
    assert gpu_check.check_alpha_gradients(options) == []
    out = capsys.readouterr().out
    assert out.count('(float32 math: ') == 2 and 'FAILED' not in out
    monkeypatch.setattr(gpu_check, 'FLOOR_FACTOR', 0.0)
    assert len(gpu_check.check_alpha_gradients(options)) == 2


def test_log_values_reads_tensors_and_numbers():
    values = log_values(dict(loss_cls=torch.tensor(0.5), loss=torch.tensor([1.5]), segment_inexact_rows=3.0),
                        torch.tensor(2.0))
    assert values == dict(loss_cls=0.5, loss=1.5, segment_inexact_rows=3.0, grad_norm=2.0)
    assert log_values(dict(loss=1.0), None) == dict(loss=1.0)


def test_failure_summary_names_every_failure():
    assert gpu_check.failure_summary([]) == ('\ncheck_gpu passed', 0)
    text, status = gpu_check.failure_summary(['accuracy x: FAILED', 'training: step 0 failed: E'])
    assert status == 1 and text.splitlines()[1:] == ['check_gpu FAILED (2 cases):', '  accuracy x: FAILED',
                                                     '  training: step 0 failed: E']


def test_accuracy_table_runs_the_other_window_slot_formulations_on_the_local_biases(capsys, slot_formulations_used):
    """On the CPU the local biases get ``segment`` rows with the 'sparse' and 'gather' products (CUDA, whose
    default is the Triton kernels: 'gather' too), which really run through them, and the default formulation is
    restored afterwards."""
    from projects.mmdet3d_plugin.attention.slots import window_slots
    default = window_slots.default_formulation(torch.device('cpu'))
    options = gpu_check.GpuCheckOptions(device='cpu', layouts=['quick'], queries=12, dtypes=['float32'])
    assert gpu_check.check_accuracy(options) == []
    lines = capsys.readouterr().out.splitlines()
    for formulation in ('sparse', 'gather'):
        rows = [line for line in lines if f'({formulation} window slots)' in line]
        assert [row.split(' | ')[2] for row in rows] == ['local', 'both'] and all('| ok |' in row for row in rows)
    assert {'sparse', 'gather', default} <= set(slot_formulations_used)
    assert window_slots.default_formulation(torch.device('cpu')) == default == 'cpp'
    assert [backend for backend, _ in gpu_check._accuracy_rows('cuda', 'local')][-1] == 'segment'
    assert gpu_check._accuracy_rows('cuda', 'local')[-1][1] == 'gather', 'the Triton kernels are the default row'
    assert all(formulation is None for _, formulation in gpu_check._accuracy_rows('cuda', 'global'))
    for kind in gpu_check.BIAS_KINDS:  # the backend auto does not pick yet: every bias kind, on CUDA only
        assert ('tiled_bias', None) in gpu_check._accuracy_rows('cuda', kind)
        assert 'tiled_bias' not in [backend for backend, _ in gpu_check._accuracy_rows('cpu', kind)]
