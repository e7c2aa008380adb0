"""Denoising queries: group layout, the self-attention mask, label noise and batches without boxes."""
import pytest
import torch

from projects.mmdet3d_plugin.models.utils.denoising import build_dn_queries, dn_self_attn_mask, num_dn_groups

PC_RANGE = [-50.0, -50.0, -5.0, 50.0, 50.0, 3.0]
NUM_CLASSES = 10


def _boxes(n, size=2.0):
    boxes = torch.zeros(n, 9)
    boxes[:, 0] = torch.arange(n, dtype=torch.float32) * 10 - 20
    boxes[:, 1] = 5.0
    boxes[:, 3:6] = size
    return boxes


def _build(boxes, labels, num_queries=20, max_groups=3, noise_scale=1.0, split=0.75):
    return build_dn_queries(boxes, labels, num_queries, max_groups, noise_scale, 0.0, split, PC_RANGE, NUM_CLASSES)


def test_self_attn_mask_layout():
    mask = dn_self_attn_mask(groups=3, group_size=2, num_queries=4)
    assert mask.shape == (10, 10) and mask.dtype == torch.bool
    # matching queries see each other but no DN query
    assert not mask[6:, 6:].any() and mask[6:, :6].all()
    # a DN query sees its own group and the matching queries only
    for group in range(3):
        rows = slice(2 * group, 2 * group + 2)
        allowed = torch.zeros(10, dtype=torch.bool)
        allowed[2 * group:2 * group + 2] = True
        allowed[6:] = True
        assert torch.equal(mask[rows], (~allowed).expand(2, 10))


def test_group_count_rule():
    assert num_dn_groups(10, 900, 30) == 10
    assert num_dn_groups(10, 900, 200) == 4
    assert num_dn_groups(10, 900, 0) == 0
    assert num_dn_groups(10, 5, 6) == 0


def test_slots_targets_and_reference_points():
    torch.manual_seed(1)
    boxes = [_boxes(2), _boxes(3)]
    labels = [torch.tensor([1, 2]), torch.tensor([3, 4, 5])]
    dn = _build(boxes, labels, noise_scale=0.0)
    assert dn.groups == 3 and dn.pad_size == 9
    assert dn.self_attn_mask.shape == (29, 29)
    # group-major order: group g holds sample 0's boxes at slots 3g, 3g+1 and sample 1's at 3g..3g+2
    assert dn.batch_index.tolist() == [0, 0, 1, 1, 1] * 3
    assert dn.query_index.tolist() == [0, 1, 0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 6, 7, 8]
    assert dn.gt_labels.tolist() == [1, 2, 3, 4, 5] * 3
    assert torch.equal(dn.labels, dn.gt_labels)  # no noise: nothing turns into background
    # without noise the reference point is the normalised box centre; unused slots stay at 0
    expected = (boxes[1][2, :3] - torch.tensor(PC_RANGE[:3])) / torch.tensor([100.0, 100.0, 8.0])
    torch.testing.assert_close(dn.reference_points[1, 5], expected)
    assert torch.all(dn.reference_points[0, 2] == 0)
    torch.testing.assert_close(dn.gt_bboxes[:5], torch.cat(boxes))


def test_noise_is_bounded_and_far_copies_are_background():
    torch.manual_seed(0)
    boxes = [_boxes(4, size=4.0)]
    labels = [torch.tensor([0, 1, 2, 3])]
    dn = _build(boxes, labels, num_queries=400, max_groups=50, split=0.75)
    centres = dn.reference_points[0, dn.query_index] * torch.tensor([100.0, 100.0, 8.0]) + torch.tensor(PC_RANGE[:3])
    offset = (centres - dn.gt_bboxes[:, :3]).abs()
    assert offset.max() <= 2.0 + 1e-4  # at most half the box size per axis
    assert offset.max() > 1.0
    background = dn.labels == NUM_CLASSES
    assert 0 < background.sum() < len(background)
    assert torch.equal(dn.labels[~background], dn.gt_labels[~background])


def test_batches_without_boxes_have_no_dn_queries():
    empty = [torch.zeros(0, 9), torch.zeros(0, 9)]
    empty_labels = [torch.zeros(0, dtype=torch.long)] * 2
    assert _build(empty, empty_labels) is None
    # more boxes in one sample than queries: no group fits
    assert _build([_boxes(25)], [torch.zeros(25, dtype=torch.long)], num_queries=20) is None


def test_sample_without_boxes_next_to_one_with_boxes():
    dn = _build([torch.zeros(0, 9), _boxes(2)], [torch.zeros(0, dtype=torch.long), torch.tensor([1, 1])])
    assert dn.pad_size == 6
    assert dn.batch_index.tolist() == [1, 1] * 3
    assert torch.all(dn.reference_points[0] == 0)
    assert torch.isfinite(dn.reference_points).all()


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match='9'):
        _build([torch.zeros(2, 7)], [torch.zeros(2, dtype=torch.long)])
    with pytest.raises(ValueError, match='labels'):
        _build([_boxes(2)], [torch.zeros(3, dtype=torch.long)])


def test_denoising_config_builds_the_queries_of_its_options():
    from projects.mmdet3d_plugin.models.utils.denoising import DenoisingConfig
    boxes = [torch.tensor([[1.0, 2.0, 0.0, 2.0, 4.0, 1.5, 0.3, 0.0, 0.0]])]
    labels = [torch.tensor([2])]
    pc_range = [-10.0, -10.0, -5.0, 10.0, 10.0, 3.0]
    assert DenoisingConfig(scalar=0).queries(boxes, labels, 20, pc_range, 5) is None
    config = DenoisingConfig(scalar=3, noise_scale=0.5, noise_trans=0.1, split=0.5)
    torch.manual_seed(0)
    queries = config.queries(boxes, labels, 20, pc_range, 5)
    torch.manual_seed(0)
    expected = build_dn_queries(boxes, labels, 20, 3, 0.5, 0.1, 0.5, pc_range, 5)
    assert queries.groups == 3 and torch.equal(queries.reference_points, expected.reference_points)
    assert torch.equal(queries.labels, expected.labels)
