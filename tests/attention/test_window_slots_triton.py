"""The ``'triton'`` formulation of the window slot products (issue 37's fused kernels) equals the CPU one.

Triton's interpreter runs its kernels on CPU tensors, but only when
``TRITON_INTERPRET=1`` is set before Triton is first imported, which the
package does (through torch's FlexAttention): the checks live in
``triton_interpreter_checks.py`` and run here in a pytest process of their
own with the variable set. What only a GPU can tell (compilation for the
device, speed) is left to ``tools/benchmark_attention.py --slot-formulation
triton`` (docs/attention.md).
"""
import pytest
import torch

from projects.mmdet3d_plugin.attention.slots.window_slots import SlotPattern

#: the checks of triton_interpreter_checks.py (parametrised cases counted): all must pass, none be skipped
NUM_CHECKS = 8


@pytest.mark.slow(seconds=40)
def test_triton_kernels_equal_the_reference_under_the_interpreter(run_under_triton_interpreter):
    run_under_triton_interpreter('triton_interpreter_checks.py', NUM_CHECKS)


def test_triton_formulation_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    index = torch.zeros(1, 2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="'triton' slot products run on CUDA tensors, or on the CPU under"):
        SlotPattern(index, 4, 1, formulation='triton')
    with pytest.raises(ValueError, match='formulation must be one of'):
        SlotPattern(index, 4, 1, formulation='embedding_bag')


def test_formulation_override_is_restored_and_names_are_checked():
    from projects.mmdet3d_plugin.attention.slots.window_slots import (FORMULATIONS, default_formulation,
                                                                                  formulation_override)
    cuda = torch.device('cuda')
    assert FORMULATIONS['cuda'] == 'triton'
    with formulation_override(cuda, 'gather'):
        assert default_formulation(cuda) == 'gather'
    assert FORMULATIONS['cuda'] == 'triton'
    with formulation_override('xpu', 'sparse'):
        assert default_formulation(torch.device('xpu')) == 'sparse'
    assert 'xpu' not in FORMULATIONS and default_formulation(torch.device('xpu')) == 'gather'
    with pytest.raises(RuntimeError, match='inside'):
        with formulation_override('cpu', 'gather'):
            assert default_formulation(torch.device('cpu')) == 'gather'
            raise RuntimeError('inside')
    assert FORMULATIONS['cpu'] == 'cpp'
    with pytest.raises(ValueError, match='formulation must be one of'):
        with formulation_override('cpu', 'embedding_bag'):
            pass


def test_cuda_takes_the_triton_kernels_where_triton_is_installed(monkeypatch):
    """The Triton kernels are CUDA's default (measured faster than 'gather' on an H200, docs/gpu.md); a CUDA
    machine without the triton package gets 'gather' instead of a pattern that cannot run."""
    import importlib.util

    from projects.mmdet3d_plugin.attention.slots.window_slots import default_formulation
    pytest.importorskip('triton', reason='the triton package comes with the CUDA builds of torch that setup installs')
    assert default_formulation(torch.device('cuda')) == 'triton'
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *args: None if name == 'triton' else
                        find_spec(name, *args))
    assert default_formulation(torch.device('cuda')) == 'gather'
    assert default_formulation(torch.device('cpu')) == 'cpp'
