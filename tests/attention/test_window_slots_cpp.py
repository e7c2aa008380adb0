"""The ``'cpp'`` formulation: the CPU's window slot dot products through the project's C++ kernel.

``tools/setup_env.sh`` compiles ``slot_dot_cpu.cpp``; these tests need it
built from the current source (``make test`` runs setup first) and fail,
not skip, where it is not.
The kernel is checked directly against a float64 reference (its AVX2 loop at
``d = 32``, its portable loop with and without a channel tail, strided
tables, a column outside the table), then as a formulation against
``'sparse'`` (each product, the ``segment`` backend's outputs and gradients,
the AQR router's window attention), and the fallback to ``'sparse'`` where
it is not built or was built from another source.
"""
import pytest
import torch

from projects.mmdet3d_plugin.attention.slots import cpu_slot_dot, window_slots
from projects.mmdet3d_plugin.attention.slots.window_slots import SlotPattern, default_formulation
from test_window_slots_gather import (check_local_window_attention_formulations_agree, check_products_against_sparse,
                                      check_segment_backend_formulations_agree)


def _reference(a, table, columns, scale):
    """``scale * a[r] . table[columns[r, j]]`` in float64."""
    return scale * torch.einsum('rd,rld->rl', a.double(), table.double()[columns])


def test_the_kernel_is_built_and_is_the_cpus_default():
    assert cpu_slot_dot.not_available_reasons() == []
    assert window_slots.FORMULATIONS['cpu'] == 'cpp' and default_formulation(torch.device('cpu')) == 'cpp'
    expected = 'avx2' if torch.backends.cpu.get_cpu_capability() in ('AVX2', 'AVX512') else 'portable'
    assert cpu_slot_dot.code_path(32) == expected
    assert cpu_slot_dot.code_path(12) == 'portable'  # not a multiple of 8 channels


@pytest.mark.parametrize('dim', [32, 16, 12, 5])
@pytest.mark.parametrize('row_stride', [None, 40])
def test_the_kernel_equals_a_float64_reference(dim, row_stride):
    """Both loops (32 and 16 channels take AVX2 where the processor has it; 12 and 5 the portable one, 5 all in its
    tail), on a contiguous table and on one whose rows are further apart than their channels."""
    generator = torch.Generator().manual_seed(dim)
    rows, length, keys = 37, 23, 50
    a = torch.randn(rows, dim, generator=generator)
    storage = torch.randn(keys, row_stride or dim, generator=generator)
    table = storage[:, :dim]
    columns = torch.randint(0, keys, (rows, length), generator=generator)
    columns[0] = 7  # the same key in every slot of a row
    out = cpu_slot_dot.slot_dot(a, table, columns, 0.3)
    assert out.dtype == torch.float32 and out.shape == (rows, length)
    torch.testing.assert_close(out.double(), _reference(a, table, columns, 0.3), rtol=1e-6, atol=1e-6)


def test_the_kernel_rejects_a_column_outside_the_table():
    a, table = torch.randn(4, 8), torch.randn(10, 8)
    columns = torch.zeros(4, 3, dtype=torch.long)
    columns[2, 1] = 10
    with pytest.raises(RuntimeError, match="a column is outside the table's 10 rows"):
        cpu_slot_dot.slot_dot(a, table, columns, 1.0)
    columns[2, 1] = -1
    with pytest.raises(RuntimeError, match='outside the table'):
        cpu_slot_dot.slot_dot(a, table, columns, 1.0)
    with pytest.raises(RuntimeError, match='a has 8 channels but the table 6'):
        cpu_slot_dot.slot_dot(a, torch.randn(10, 6), columns.clamp(min=0), 1.0)
    with pytest.raises(RuntimeError, match='must be float32'):
        cpu_slot_dot.slot_dot(a.double(), table, columns.clamp(min=0), 1.0)


@pytest.mark.parametrize('table_dtype', [torch.float32, torch.float16])
def test_cpp_products_equal_the_sparse_ones(cases, table_dtype):
    check_products_against_sparse(cases, 'cpp', table_dtype)


def test_segment_backend_gives_the_same_result_with_the_cpp_kernel(cases, monkeypatch):
    check_segment_backend_formulations_agree(cases, monkeypatch, 'cpp')


@pytest.mark.parametrize('attn_drop', [0.0, 0.3])
def test_local_window_attention_gives_the_same_result_with_the_cpp_kernel(monkeypatch, attn_drop):
    check_local_window_attention_formulations_agree(monkeypatch, 'cpp', attn_drop)


def test_without_the_kernel_the_cpu_takes_sparse_and_cpp_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv('CMT_AQR_HOME', str(tmp_path))
    module, reasons = cpu_slot_dot._loaded.__wrapped__()  # the uncached lookup, in an empty cache
    assert module is None and 'the C++ slot kernel is not built in' in reasons[0] and str(tmp_path) in reasons[0]
    monkeypatch.setattr(cpu_slot_dot, '_loaded', lambda: (None, reasons))
    assert default_formulation(torch.device('cpu')) == 'sparse'
    assert SlotPattern(torch.zeros(1, 2, 3, dtype=torch.long), 4, 1).formulation == 'sparse'
    with pytest.raises(ValueError, match='not built in'):
        SlotPattern(torch.zeros(1, 2, 3, dtype=torch.long), 4, 1, formulation='cpp')
    with pytest.raises(RuntimeError, match='not built in'):
        cpu_slot_dot.slot_dot(torch.zeros(1, 8), torch.zeros(2, 8), torch.zeros(1, 1, dtype=torch.long), 1.0)


def test_a_build_from_another_source_is_not_used(monkeypatch):
    """A library built before its source changed is not imported (setup rebuilds it); the CPU takes 'sparse'."""
    assert cpu_slot_dot._loaded.__wrapped__()[0] is not None
    monkeypatch.setattr(cpu_slot_dot, '_source_hash', lambda: 'another source')
    module, reasons = cpu_slot_dot._loaded.__wrapped__()
    assert module is None and 'was built from another version of slot_dot_cpu.cpp' in reasons[0]


def test_cpp_formulation_needs_cpu_tensors():
    with pytest.raises(ValueError, match="the 'cpp' slot products run on CPU tensors, got meta tensors"):
        SlotPattern(torch.zeros(1, 2, 3, dtype=torch.long, device='meta'), 4, 1, formulation='cpp')
    assert default_formulation(torch.device('meta')) == 'gather'
