"""The cells of a window on a grid of keys: offsets, the decay stencil, clamping, and the key index of every cell."""
import math

import pytest
import torch

from projects.mmdet3d_plugin.attention.bias.window_cells import (check_window_size, clamp_to_grid, window_offsets,
                                                                 window_stencil, window_token_index)


def test_offsets_are_the_square_row_major():
    assert window_offsets(3).tolist() == [[-1, -1], [-1, 0], [-1, 1], [0, -1], [0, 0], [0, 1], [1, -1], [1, 0], [1, 1]]
    for size in (4, 0, -1, 2.5, True):
        with pytest.raises(ValueError, match='odd'):
            window_offsets(size)
    assert check_window_size(5.0) == 5


def test_stencil_is_the_positive_decay_disc_of_the_square():
    offsets, decay = window_stencil(15)
    assert len(offsets) == sum(1 for y in range(-7, 8) for x in range(-7, 8) if math.hypot(y, x) < 7.5)
    torch.testing.assert_close(decay, 1 - torch.sqrt(offsets.square().sum(-1).float()) / 7.5)
    square = window_offsets(15).tolist()
    assert [square.index(cell) for cell in offsets.tolist()] == sorted(square.index(cell) for cell in offsets.tolist())
    assert window_stencil(1)[0].tolist() == [[0, 0]] and window_stencil(1)[1].tolist() == [1.0]
    assert (offsets.dtype, decay.dtype) == (torch.long, torch.float32)


def test_offsets_and_stencil_are_cached_per_size():
    """Made once per window size and device: a forward asks for them every time, and must not rebuild them."""
    assert window_offsets(15) is window_offsets(15) and window_offsets(5) is not window_offsets(15)
    assert all(a is b for a, b in zip(window_stencil(15), window_stencil(15)))


def test_clamp_to_grid_clamps_each_axis_to_its_own_size():
    cells = torch.tensor([[-1, 5], [2, 9], [3, -4]])
    assert clamp_to_grid(cells, (3, 6)).tolist() == [[0, 5], [2, 5], [2, 0]]


def test_window_is_clipped_at_borders():
    index, valid = window_token_index(torch.tensor([[[0, 0], [2, 3]]]), (3, 4), window_offsets(3))
    assert sorted(index[0, 0][valid[0, 0]].tolist()) == [0, 1, 4, 5]
    # centre (2, 3) on a 3x4 grid: rows 1..2, cols 2..3
    assert sorted(index[0, 1][valid[0, 1]].tolist()) == [6, 7, 10, 11]
    assert valid.sum() == 8 and (index[~valid] == 0).all()


def test_window_plane_offsets_index_and_invalid_centre_has_no_token():
    centers = torch.tensor([[[1, 1], [1, 1]]])
    index, valid = window_token_index(centers, (3, 3), window_offsets(1), center_valid=torch.tensor([[True, False]]),
                                      plane=torch.tensor([[2, 0]]))
    assert index[0, 0].tolist() == [2 * 9 + 4] and valid[0].tolist() == [[True], [False]]


def test_first_token_offsets_every_index_of_a_grid_in_a_longer_memory():
    """The router's camera windows: after 100 BEV tokens, on plane 1 of 3x4 cells; clipped cells point at token 100."""
    index, valid = window_token_index(torch.tensor([[[0, 3]]]), (3, 4), window_offsets(3), plane=torch.tensor([[1]]),
                                      first_token=100)
    assert sorted(index[0, 0][valid[0, 0]].tolist()) == [100 + 12 + cell for cell in (2, 3, 6, 7)]
    assert valid.sum() == 4 and (index[~valid] == 100).all()
    index, valid = window_token_index(torch.tensor([[[1, 1]]]), (3, 4), window_offsets(1), first_token=7)
    assert index.tolist() == [[[7 + 5]]]


def test_stencil_cells_index_the_keys_a_loop_over_the_disc_finds():
    """Every cell of the decay stencil around random centres (int32 too: the index is long) on a 3-plane grid."""
    planes, height, width, size, first = 3, 5, 7, 5, 40
    generator = torch.Generator().manual_seed(0)
    centres = torch.stack([torch.randint(0, n, (2, 30), generator=generator) for n in (height, width)], -1)
    plane = torch.randint(0, planes, (2, 30), generator=generator)
    centre_valid = torch.rand(2, 30, generator=generator) > 0.2
    offsets, _ = window_stencil(size)
    index, valid = window_token_index(centres.int(), (height, width), offsets, centre_valid, plane, first)
    assert index.dtype == torch.long
    for b in range(2):
        for q in range(30):
            (y, x), p = centres[b, q].tolist(), int(plane[b, q])
            keys = {first + (p * height + y + dy) * width + x + dx for dy, dx in offsets.tolist()
                    if 0 <= y + dy < height and 0 <= x + dx < width} if centre_valid[b, q] else set()
            assert set(index[b, q][valid[b, q]].tolist()) == keys
            assert int(valid[b, q].sum()) == len(keys)
    assert (index[~valid] == first).all()
