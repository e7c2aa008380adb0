"""AttentionBias and its parts: dense forms, shape checks, composition."""
import math

import pytest
import torch

from projects.mmdet3d_plugin.attention import (AttentionBias, DenseBias, KeyGrid, LowRankBias, SegmentBias,
                                               WindowBias, as_attention_bias)


def loop_window_bias(window: WindowBias, num_keys: int) -> torch.Tensor:
    """Direct reference: every query, every grid, every key of the grid, the decay formula."""
    bs, num_queries = window.batch_size, window.num_queries
    dense = torch.zeros(bs, window.num_heads, num_queries, num_keys, dtype=torch.float64)
    for grid, centres, valid, amplitude, size in zip(window.grids, window.centres, window.valid, window.amplitude,
                                                     window.window_size):
        for b in range(bs):
            for q in range(num_queries):
                if not valid[b, q]:
                    continue
                plane, cy, cx = (int(c) for c in centres[b, q])
                for y in range(grid.height):
                    for x in range(grid.width):
                        dy, dx = y - cy, x - cx
                        if abs(dy) > size // 2 or abs(dx) > size // 2 or not 0 <= plane < grid.planes:
                            continue
                        decay = max(0.0, 1.0 - math.sqrt(dy * dy + dx * dx) / (size / 2))
                        key = grid.offset + (plane * grid.height + y) * grid.width + x
                        for h in range(window.num_heads):
                            head = h if amplitude.size(1) > 1 else 0
                            dense[b, h, q, key] += float(amplitude[b, head, q].detach()) * decay
    return dense


@pytest.mark.parametrize('bias_heads', [1, 3])
def test_window_to_dense_matches_loop(cases, bias_heads):
    window, _ = cases.make_window(2, bias_heads, 7, window_sizes=(5, 3))
    dense = window.to_dense(cases.NUM_KEYS)
    assert dense.shape == (2, bias_heads, 7, cases.NUM_KEYS)
    torch.testing.assert_close(dense.double(), loop_window_bias(window, cases.NUM_KEYS), rtol=0, atol=1e-6)


def test_window_to_dense_clipping_and_invalid_queries():
    grid = KeyGrid(2, 2, 3, 4)  # keys 2..25
    centres = torch.tensor([[[0, 0, 0], [1, 2, 3], [0, 1, 1], [5, 1, 1]]])
    valid = torch.tensor([[True, True, False, True]])
    amplitude = torch.tensor([[[1.0, -2.0, 3.0, 4.0]]])
    window = WindowBias(grid, centres, valid, amplitude, 3)
    dense = window.to_dense(30)[0, 0]
    torch.testing.assert_close(dense.double(), loop_window_bias(window, 30)[0, 0], rtol=0, atol=1e-6)
    radius_decay = 1 - 1 / 1.5
    # query 0 at the top-left corner of plane 0: only 4 cells, the centre gets the full amplitude
    assert dense[0].nonzero().flatten().tolist() == [2, 3, 6, 7]
    assert dense[0, 2] == pytest.approx(1.0) and dense[0, 3] == pytest.approx(radius_decay)
    assert dense[0, 7] == pytest.approx(max(0.0, 1 - math.sqrt(2) / 1.5))
    assert dense[1].nonzero().flatten().tolist() == [2 + 12 + 4 * y + x for y in (1, 2) for x in (2, 3)]
    assert not dense[2].any(), 'an invalid query gets no bias'
    assert not dense[3].any(), 'a centre on a plane outside the grid gets no bias'
    assert not dense[:, :2].any() and not dense[:, 26:].any(), 'keys outside the grid get no bias'


def test_segment_bias_dense_and_low_rank():
    values = torch.randn(2, 3, 4, 3)
    segment = SegmentBias(values, (2, 5, 1))
    dense = segment.to_dense(8)
    assert dense.shape == (2, 3, 4, 8)
    torch.testing.assert_close(dense[..., :2], values[..., :1].expand(-1, -1, -1, 2))
    torch.testing.assert_close(dense[..., 2:7], values[..., 1:2].expand(-1, -1, -1, 5))
    torch.testing.assert_close(dense[..., 7], values[..., 2])
    low_rank = segment.to_low_rank()
    assert isinstance(low_rank, LowRankBias) and low_rank.rank == 3
    torch.testing.assert_close(low_rank.to_dense(8), dense)
    assert segment.segment_bounds == [(0, 2), (2, 7), (7, 8)]


def test_low_rank_bias_dense():
    query_factor, key_factor = torch.randn(2, 1, 4, 2), torch.randn(2, 6, 2)
    dense = LowRankBias(query_factor, key_factor).to_dense(6)
    torch.testing.assert_close(dense[1, 0], query_factor[1, 0] @ key_factor[1].T)


def test_attention_bias_sum_sizes_and_dtype(cases):
    bias, _ = cases.make_bias('segment+window', bias_heads=1)
    per_head, _ = cases.make_bias('lowrank', bias_heads=3)
    total = bias + per_head
    assert isinstance(total, AttentionBias) and len(total.parts) == 3
    assert (total.batch_size, total.num_heads, total.num_queries, total.num_keys) == (2, 3, 6, cases.NUM_KEYS)
    torch.testing.assert_close(total.to_dense(), bias.to_dense() + per_head.to_dense())
    half = total.to(dtype=torch.float16)
    assert half.to_dense(torch.float16).dtype == torch.float16
    assert all(t.dtype in (torch.float16, torch.bool, torch.int64) for p in half.parts for t in p.tensors())
    mask = torch.zeros(cases.NUM_KEYS, dtype=torch.bool)
    mask[3] = True
    masked = total + mask
    assert masked.to_dense()[..., 3].isneginf().all() and isinstance(masked.parts[-1], DenseBias)


@pytest.mark.parametrize('slots_made', [False, True])
def test_select_queries_gives_the_rows_of_the_dense_bias(cases, slots_made):
    """``slots_made``: the window slots already exist (a layer used the bias): the selection takes its rows of them
    instead of building them again."""
    bias, _ = cases.make_bias('segment+window+lowrank', bias_heads=3)
    if slots_made:
        bias.to_dense()
    queries = torch.tensor([4, 0])
    selected = bias.select_queries(1, queries)
    assert selected.batch_size == 1 and selected.num_queries == 2
    torch.testing.assert_close(selected.to_dense()[0], bias.to_dense()[1][:, queries])


def test_check_names_the_mismatch(cases):
    bias, _ = cases.make_bias('segment+window', bias_heads=3)
    bias.check(2, 3, 6, cases.NUM_KEYS)
    with pytest.raises(ValueError, match='batch size is 2'):
        bias.check(4, 3, 6, cases.NUM_KEYS)
    with pytest.raises(ValueError, match='number of heads is 3'):
        bias.check(2, 4, 6, cases.NUM_KEYS)
    with pytest.raises(ValueError, match='number of queries is 6'):
        bias.check(2, 3, 7, cases.NUM_KEYS)
    with pytest.raises(ValueError, match='85 keys'):
        bias.check(2, 3, 6, 86)


def test_dense_bias_broadcasts_but_structured_parts_do_not():
    DenseBias(torch.zeros(1, 1, 1, 5)).check(3, 4, 7)
    with pytest.raises(ValueError, match='batch size'):
        SegmentBias(torch.zeros(1, 1, 7, 1), (5, )).check(3, 4, 7)


@pytest.mark.parametrize('build, message', [
    (lambda: SegmentBias(torch.zeros(1, 1, 2, 3), (4, 4)), 'segments'),
    (lambda: SegmentBias(torch.zeros(1, 1, 2, 2, dtype=torch.long), (4, 4)), 'float'),
    (lambda: LowRankBias(torch.zeros(1, 1, 2, 3), torch.zeros(1, 4, 2)), 'rank'),
    (lambda: LowRankBias(torch.zeros(2, 1, 2, 3), torch.zeros(3, 4, 3)), 'batch size'),
    (lambda: WindowBias(KeyGrid(0, 1, 2, 2), torch.zeros(1, 2, 3, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool),
                        torch.zeros(1, 1, 2), 4), 'odd'),
    (lambda: WindowBias(KeyGrid(0, 1, 2, 2), torch.zeros(1, 2, 3), torch.ones(1, 2, dtype=torch.bool),
                        torch.zeros(1, 1, 2), 3), 'int'),
    (lambda: WindowBias(KeyGrid(0, 1, 2, 2), torch.zeros(1, 2, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool),
                        torch.zeros(1, 1, 2), 3), 'disagree'),
    (lambda: WindowBias([KeyGrid(0, 1, 2, 2), KeyGrid(3, 1, 2, 2)], [torch.zeros(1, 2, 3, dtype=torch.long)] * 2,
                        [torch.ones(1, 2, dtype=torch.bool)] * 2, [torch.zeros(1, 1, 2)] * 2, 3), 'overlap'),
    (lambda: KeyGrid(0, 0, 2, 2), 'planes'),
    (lambda: AttentionBias(SegmentBias(torch.zeros(1, 1, 2, 1), (4, )), 5), 'cover 4 keys'),
    (lambda: AttentionBias([SegmentBias(torch.zeros(1, 1, 2, 1), (4, )),
                            SegmentBias(torch.zeros(1, 1, 3, 1), (4, ))], 4), 'disagree on the number of queries'),
    (lambda: AttentionBias(WindowBias(KeyGrid(2, 1, 2, 2), torch.zeros(1, 2, 3, dtype=torch.long),
                                      torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 1, 2), 3), 5),
     'ends at key 6'),
])
def test_bad_construction_raises(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_as_attention_bias():
    assert as_attention_bias(None) is None
    dense = as_attention_bias(torch.zeros(3, 5, dtype=torch.bool))
    assert isinstance(dense.parts[0], DenseBias) and dense.num_keys == 5 and dense.num_queries == 3
    assert as_attention_bias(SegmentBias(torch.zeros(1, 1, 2, 1), (4, ))).num_keys == 4
    window = WindowBias(KeyGrid(0, 1, 2, 2), torch.zeros(1, 2, 3, dtype=torch.long),
                        torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 1, 2), 3)
    with pytest.raises(ValueError, match='wrap it in AttentionBias'):
        as_attention_bias(window)
    assert as_attention_bias(window, num_keys=6).num_keys == 6
    with pytest.raises(TypeError):
        as_attention_bias([1, 2])


def test_gradients_flow_through_to_dense(cases):
    bias, leaves = cases.make_bias('segment+window+lowrank', bias_heads=3)
    bias.to_dense().sum().backward()
    assert all(leaf.grad is not None and leaf.grad.abs().sum() > 0 for leaf in leaves)


@pytest.mark.parametrize('kind', ['segment', 'window', 'lowrank', 'dense', 'mask'])
def test_score_term_is_the_dense_bias_at_every_index(cases, kind):
    """``part.score_term`` (what flex's ``score_mod`` adds) equals ``to_dense`` at every (b, h, q, k), also for rows
    past Q that repeat the last query (flex's query bucket)."""
    bs, heads, num_queries, num_keys = 2, 3, 5, cases.NUM_KEYS
    if kind == 'mask':
        bias = AttentionBias(DenseBias(torch.rand(bs, 1, num_queries, num_keys) > 0.7), num_keys)
    else:
        bias, _ = cases.make_bias(kind, bs=bs, heads=heads, num_queries=num_queries, bias_heads=heads,
                                  requires_grad=False)
    (part, ) = bias.parts
    rows = torch.arange(num_queries + 2).clamp_(max=num_queries - 1)
    term = part.score_term((bs, heads, num_queries, num_keys), rows)
    b, h, i, k = torch.meshgrid(*(torch.arange(n) for n in (bs, heads, len(rows), num_keys)), indexing='ij')
    expected = part.to_dense(num_keys).expand(bs, heads, num_queries, num_keys)[:, :, rows]
    torch.testing.assert_close(torch.as_tensor(term(b, h, i, k), dtype=torch.float32), expected)


def test_parts_say_what_backends_need_to_know_without_a_type_test(cases):
    segment, _ = cases.make_bias('segment', requires_grad=False)
    window, _ = cases.make_bias('window', requires_grad=False)
    low_rank, _ = cases.make_bias('lowrank', requires_grad=False)
    dense, _ = cases.make_bias('dense', requires_grad=False)
    mask = DenseBias(torch.rand(2, 1, 6, cases.NUM_KEYS) > 0.5)
    parts = [bias.parts[0] for bias in (segment, window, low_rank, dense)] + [mask]
    assert [p.is_structured for p in parts] == [True, True, True, False, False]
    assert [p.is_window for p in parts] == [False, True, False, False, False]
    assert [p.is_mask for p in parts] == [False, False, False, False, True]
    assert low_rank.parts[0].to_low_rank() is low_rank.parts[0]
    torch.testing.assert_close(segment.parts[0].to_low_rank().to_dense(cases.NUM_KEYS),
                               segment.parts[0].to_dense(cases.NUM_KEYS))
    for part in (window.parts[0], mask):
        with pytest.raises(TypeError, match='no low-rank form'):
            part.to_low_rank()


def test_window_keys_computes_the_slots_once_and_the_weights_on_every_call(cases):
    """The decoder layers share a bias: its slots are made once, its weights each time, with their gradients (also
    after a call without gradients)."""
    window, amplitudes = cases.make_window(2, 3, 7, window_sizes=(5, 3))
    with torch.no_grad():
        first = window.window_keys()
    second = window.window_keys()
    assert second.index is first.index and second.valid is first.valid
    assert not first.weight.requires_grad and second.weight.requires_grad
    fresh_amplitudes = [a.detach().clone().requires_grad_() for a in amplitudes]
    fresh = WindowBias(window.grids, window.centres, window.valid, fresh_amplitudes, window.window_size).window_keys()
    for keys in (first, second):
        torch.testing.assert_close(keys.index, fresh.index, rtol=0, atol=0)
        torch.testing.assert_close(keys.weight, fresh.weight)
    second.weight.pow(2).sum().backward()
    fresh.weight.pow(2).sum().backward()
    for amplitude, expected in zip(amplitudes, fresh_amplitudes):
        assert expected.grad.abs().sum() > 0
        torch.testing.assert_close(amplitude.grad, expected.grad)
