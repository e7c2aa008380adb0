"""normalize_bbox / denormalize_bbox: CMT's box code order and round trip."""
import math

import pytest
import torch

from projects.mmdet3d_plugin.core.bbox.util import denormalize_bbox, normalize_bbox

PC_RANGE = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]


def test_code_order_matches_upstream_cmt():
    box = torch.tensor([[1.0, 2.0, -1.0, 2.0, 4.0, 1.5, math.pi / 6, 0.5, -0.25]])
    code = normalize_bbox(box, PC_RANGE)
    expected = torch.tensor([[1.0, 2.0, math.log(2.0), math.log(4.0), -1.0, math.log(1.5),
                              math.sin(math.pi / 6), math.cos(math.pi / 6), 0.5, -0.25]])
    torch.testing.assert_close(code, expected)


@pytest.mark.parametrize('dims', [7, 9])
def test_round_trip(dims):
    boxes = torch.rand(5, dims) * 3 + 0.1
    boxes[:, 6] = torch.tensor([-3.0, -1.0, 0.0, 1.0, 3.0])  # yaw inside (-pi, pi]
    code = normalize_bbox(boxes, PC_RANGE)
    assert code.shape == (5, dims + 1)
    torch.testing.assert_close(denormalize_bbox(code, PC_RANGE), boxes)


def test_batched_leading_dims():
    boxes = torch.rand(2, 3, 9) + 0.5
    assert normalize_bbox(boxes).shape == (2, 3, 10)
    assert denormalize_bbox(normalize_bbox(boxes)).shape == (2, 3, 9)


def test_wrong_sizes_raise():
    with pytest.raises(ValueError, match='7 or 9'):
        normalize_bbox(torch.zeros(3, 8))
    with pytest.raises(ValueError, match='8 or 10'):
        denormalize_bbox(torch.zeros(3, 9))
