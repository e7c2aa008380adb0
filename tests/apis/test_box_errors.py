"""apis/box_errors.py: detections matched to ground truth per class, heading errors split right / sideways / flipped."""
import math

import torch

from projects.mmdet3d_plugin.apis.box_errors import error_table, heading_error, match_boxes


def boxes(rows):
    """``(x, y, yaw, vx, vy)`` rows -> ``[n, 9]`` boxes."""
    out = torch.zeros(len(rows), 9)
    out[:, [0, 1, 6, 7, 8]] = torch.tensor(rows, dtype=torch.float32).reshape(-1, 5)
    out[:, 3:6] = 1.0
    return out


def test_matching_is_greedy_by_score_within_the_class_and_the_distance():
    gt = boxes([[0.0, 0.0, 0.1, 1.0, 0.0], [10.0, 0.0, 0.2, 0.0, 0.0], [20.0, 0.0, 0.3, 0.0, 0.0]])
    det = boxes([[0.5, 0.0, 1.1, 0.0, 0.0],  # low score, nearest to gt 0
                 [1.0, 0.0, 1.2, 0.0, 0.0],  # high score: takes gt 0
                 [10.0, 0.0, 1.3, 0.0, 0.0],  # wrong class for gt 1
                 [23.0, 0.0, 1.4, 0.0, 0.0]])  # 3 m from gt 2
    matches = match_boxes(gt, torch.tensor([0, 1, 0]), det, torch.tensor([0, 0, 0, 0]),
                          torch.tensor([0.2, 0.9, 0.8, 0.7]))
    assert matches.labels.tolist() == [0]
    torch.testing.assert_close(matches.det_yaw, torch.tensor([1.2]))
    torch.testing.assert_close(matches.gt_velocity, torch.tensor([[1.0, 0.0]]))
    empty = match_boxes(gt, torch.tensor([0, 1, 0]), boxes([]), torch.zeros(0, dtype=torch.long), torch.zeros(0))
    assert len(empty.labels) == 0


def test_heading_error_wraps_around():
    torch.testing.assert_close(heading_error(torch.tensor([3.0, 0.5]), torch.tensor([-3.0, 0.5 + math.pi])),
                               torch.tensor([2 * math.pi - 6.0, math.pi]))


def test_the_table_splits_right_sideways_and_flipped_headings():
    yaws = [0.0, 0.0, 0.0, 0.0]
    gt = boxes([[i * 10.0, 0.0, yaw, 2.0, 0.0] for i, yaw in enumerate(yaws)])
    det = boxes([[0.0, 0.0, 0.2, 2.0, 0.0], [10.0, 0.0, 1.9, 0.0, 0.0], [20.0, 0.0, math.pi, 0.0, 0.0],
                 [30.0, 0.0, -0.3, 2.0, 0.0]])
    matches = match_boxes(gt, torch.zeros(4, dtype=torch.long), det, torch.zeros(4, dtype=torch.long), torch.ones(4))
    rows = {line.split('|')[1].strip(): [cell.strip() for cell in line.split('|')[2:-1]]
            for line in error_table(matches, ['car', 'bus']).splitlines()[2:]}
    assert set(rows) == {'car', 'all'}
    matched, right, sideways, flipped, median, axis, velocity, zero = rows['car']
    assert (matched, right, sideways, flipped) == ('4', '0.50', '0.25', '0.25')
    assert (velocity, zero) == ('1.00', '2.00')
