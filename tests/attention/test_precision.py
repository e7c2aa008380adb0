"""attention_compute_dtype: the cross-attention's precision per option, device, input dtype and autocast."""
import pytest
import torch

from projects.mmdet3d_plugin.attention.precision import (ATTENTION_DTYPES, attention_compute_dtype,
                                                         check_attention_dtype)

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


@pytest.mark.parametrize('option, device_type, input_dtype, expected', [
    ('auto', 'cuda', F32, F16),  # upstream CMT: float16 between float32 projections
    ('auto', 'cpu', F32, F32),  # the CPU computes as it did
    ('auto', 'cuda', BF16, BF16),  # a model already in half precision keeps its dtype
    ('auto', 'cuda', F64, F64),  # a float64 check keeps float64
    ('auto', 'cpu', F16, F16),
    ('float16', 'cpu', F32, F16),  # a named dtype on every device
    ('bfloat16', 'cuda', F32, BF16),
    ('float32', 'cuda', F32, F32),
    ('float32', 'cuda', F16, F32),
])
def test_the_decision_table(option, device_type, input_dtype, expected):
    assert attention_compute_dtype(option, device_type, input_dtype) == expected


@pytest.mark.parametrize('option', sorted(ATTENTION_DTYPES))
def test_autocast_decides_where_it_is_on(option):
    """Under autocast the projections' output dtype is autocast's: nothing is cast, whatever the option."""
    assert attention_compute_dtype(option, 'cuda', F16, autocast=True) == F16
    assert attention_compute_dtype(option, 'cpu', BF16, autocast=True) == BF16


@pytest.mark.parametrize('option', ['fp16', 'half', 'float64', None])
def test_an_unknown_option_names_the_allowed_values(option):
    with pytest.raises(ValueError, match=r"attention_dtype must be one of \['auto', 'float16', 'bfloat16', "
                                         r"'float32'\]"):
        check_attention_dtype(option)
    with pytest.raises(ValueError, match='attention_dtype must be one of'):
        attention_compute_dtype(option, 'cuda', F32)
