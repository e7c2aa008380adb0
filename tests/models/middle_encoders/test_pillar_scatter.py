"""BatchPillarScatter: mmdet3d's PointPillarsScatter's output and gradient, without a boolean-mask backward."""
import pytest
import torch
from mmdet3d.models.builder import build_middle_encoder

from projects.mmdet3d_plugin.models.middle_encoders import BatchPillarScatter
from projects.mmdet3d_plugin.utils.host_data import SyncingOpRecorder

CHANNELS, GRID = 6, (5, 7)


def pillars(counts, seed=0):
    """``[M, C]`` features (requiring grad) and ``[M, 4]`` coordinates, ``counts[i]`` distinct cells in sample i."""
    generator = torch.Generator().manual_seed(seed)
    coors = []
    for sample, count in enumerate(counts):
        cells = torch.randperm(GRID[0] * GRID[1], generator=generator)[:count]
        coors.append(torch.stack([torch.full_like(cells, sample), torch.zeros_like(cells),
                                  cells // GRID[1], cells % GRID[1]], dim=1))
    coors = torch.cat(coors).int()
    features = torch.randn(len(coors), CHANNELS, generator=generator, requires_grad=True)
    return features, coors


def run(encoder, features, coors, batch_size):
    features = features.detach().requires_grad_()
    output = encoder(features, coors, batch_size)
    output.backward(torch.arange(output.numel(), dtype=output.dtype).view_as(output))
    return output, features.grad


@pytest.mark.parametrize('counts', [(4, 9), (0, 6), (5, 0, 3), (1, )])
def test_equals_mmdet3d_point_pillars_scatter(counts):
    reference = build_middle_encoder(dict(type='PointPillarsScatter', in_channels=CHANNELS, output_shape=GRID))
    batched = build_middle_encoder(dict(type='BatchPillarScatter', in_channels=CHANNELS, output_shape=GRID))
    features, coors = pillars(counts)
    expected, expected_grad = run(reference, features, coors, len(counts))
    actual, actual_grad = run(batched, features, coors, len(counts))
    assert actual.shape == (len(counts), CHANNELS) + GRID and actual.stride() == expected.stride()
    assert torch.equal(actual, expected)
    assert torch.equal(actual_grad, expected_grad)


def test_without_batch_size_scatters_every_pillar_into_one_sample():
    reference = build_middle_encoder(dict(type='PointPillarsScatter', in_channels=CHANNELS, output_shape=GRID))
    features, coors = pillars((6, ))
    assert torch.equal(BatchPillarScatter(CHANNELS, GRID)(features, coors), reference(features, coors))


def test_backward_has_no_op_that_waits_for_the_device():
    """mmdet3d's scatter indexes with a boolean mask (its backward runs nonzero: a host sync on CUDA); ours not."""
    features, coors = pillars((4, 9))
    for encoder, expected in ((build_middle_encoder(dict(type='PointPillarsScatter', in_channels=CHANNELS,
                                                         output_shape=GRID)), False),
                              (BatchPillarScatter(CHANNELS, GRID), True)):
        output = encoder(features, coors, 2)
        with SyncingOpRecorder() as recorder:
            output.sum().backward()
        assert (recorder.ops == []) == expected, recorder.ops


@pytest.mark.parametrize('features_shape, coors_shape, match', [
    ((3, CHANNELS + 1), (3, 4), 'voxel_features must be'), ((3, CHANNELS), (2, 4), 'coors must be')])
def test_wrong_shapes_raise(features_shape, coors_shape, match):
    with pytest.raises(ValueError, match=match):
        BatchPillarScatter(CHANNELS, GRID)(torch.zeros(features_shape), torch.zeros(coors_shape, dtype=torch.int))


def test_output_shape_must_be_two_numbers():
    with pytest.raises(ValueError, match='output_shape'):
        BatchPillarScatter(CHANNELS, (1, 5, 7))
