"""--autoscale-lr (mmdet3d's meaning): the configs' learning rate is set for 8 GPUs and scales linearly with the
number of processes (tests/tools/test_slurm.py checks tools/train.py applies it with 2 processes)."""
import pytest

from projects.mmdet3d_plugin.apis.train import REFERENCE_GPUS, linear_scaled_lr


def test_lr_scales_linearly_with_the_processes_relative_to_8():
    assert REFERENCE_GPUS == 8
    assert linear_scaled_lr(2e-4, 8) == pytest.approx(2e-4)
    assert linear_scaled_lr(2e-4, 2) == pytest.approx(5e-5)
    assert linear_scaled_lr(2e-4, 16) == pytest.approx(4e-4)
    assert linear_scaled_lr(1e-3, 1) == pytest.approx(1.25e-4)
    assert linear_scaled_lr(1e-3, 3, reference_gpus=6) == pytest.approx(5e-4)


def test_a_process_count_below_one_is_an_error():
    with pytest.raises(ValueError, match='positive process counts'):
        linear_scaled_lr(1e-3, 0)
