"""experiments/lie_probe_targets.py: the per-query LiDAR and camera lie truths."""
import pytest
import torch

from projects.mmdet3d_plugin.experiments.lie_probe_targets import lie_targets, yawed_view_mask

# one ghost: a 4 x 2 m box at the origin, heading +x
GHOST = [[0.0, 0.0, -1.0, 4.0, 2.0, 1.5, 0.0]]


def test_a_query_within_2_m_of_a_ghost_and_one_in_a_yawed_view_are_lied_to():
    meta = dict(corruption=dict(ghost_boxes=GHOST, yawed_views=[2]))
    # queries: inside the box, 3.9 m ahead (half length 2 + margin 2 = 4 m), 4.5 m ahead, far away
    xyz = torch.tensor([[0.0, 0.0, 0.0], [3.9, 0.0, 0.0], [4.5, 0.0, 0.0], [10.0, 10.0, 0.0]])
    pers = torch.tensor([[2, 1, 1], [0, 1, 1], [2, 3, 3], [-1, -1, -1]])
    visible = torch.tensor([True, True, True, False])
    targets = lie_targets(xyz, pers, visible, meta, num_views=6)
    assert targets.dtype == torch.bool and targets.shape == (4, 2)
    assert targets[:, 0].tolist() == [True, True, False, False]
    # view 2 is yawed; the invisible query's -1 view is not read as a view
    assert targets[:, 1].tolist() == [True, False, True, False]


def test_a_clean_sample_lies_nowhere_and_a_dead_view_is_no_yawed_view():
    xyz = torch.zeros(3, 3)
    pers = torch.tensor([[0, 0, 0], [1, 0, 0], [5, 0, 0]])
    visible = torch.ones(3, dtype=torch.bool)
    assert not lie_targets(xyz, pers, visible, {}, num_views=6).any()
    meta = dict(corruption=dict(views=[1], yawed_views=[5]))
    assert yawed_view_mask(meta, 6, torch.device('cpu')).tolist() == [False] * 5 + [True]
    assert lie_targets(xyz, pers, visible, meta, num_views=6)[:, 1].tolist() == [False, False, True]


def test_shapes_are_checked():
    with pytest.raises(ValueError, match='pers_index'):
        lie_targets(torch.zeros(3, 3), torch.zeros(2, 3, dtype=torch.long), torch.ones(3, dtype=torch.bool), {}, 6)
