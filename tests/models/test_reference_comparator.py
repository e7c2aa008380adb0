"""``differs_from_reference`` (``tests/models/conftest.py``), the comparator of the recorded-reference tests."""
import math

import torch


def test_equal_and_rounding_level_differences_pass(cmt_test_data):
    differs = cmt_test_data['differs_from_reference']
    expected = torch.tensor([[10.0, -3.0], [0.5, 2.0]])
    assert not differs(expected.clone(), expected)
    assert not differs(expected + 5e-5, expected), '5e-6 of the largest value is float32 rounding, not a change'


def test_nan_and_infinity_fail_where_the_reference_is_finite(cmt_test_data):
    differs = cmt_test_data['differs_from_reference']
    expected = torch.tensor([1.0, 2.0, 3.0])
    for bad in (math.nan, math.inf, -math.inf):
        actual = expected.clone()
        actual[1] = bad
        assert differs(actual, expected), bad
    assert differs(torch.full((3, ), math.nan), torch.full((3, ), math.nan)) is False, 'a NaN recorded as NaN'
    assert differs(torch.tensor([math.inf]), torch.tensor([-math.inf]))


def test_shape_changes_and_real_changes_fail(cmt_test_data):
    differs = cmt_test_data['differs_from_reference']
    expected = torch.tensor([1.0, 2.0, 3.0])
    assert differs(expected[:2], expected)
    assert differs(expected + torch.tensor([0.0, 1e-3, 0.0]), expected)
