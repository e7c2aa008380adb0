"""diagnostics/attention_benchmark.py: its seed-loop baseline builds the same bias, and the crossover tabulates
every size with the pick of ``auto`` and marks where it switches."""
import torch

from projects.mmdet3d_plugin.diagnostics.attention_benchmark import (BenchmarkOptions, run_attention_benchmark,
                                                              seed_local_bias_loop)
from projects.mmdet3d_plugin.diagnostics.attention_benchmark_tables import benchmark_report
from projects.mmdet3d_plugin.diagnostics.attention_cases import KEY_LAYOUTS, build_bias_factors, make_bias
from projects.mmdet3d_plugin.attention import dispatch


def _local_case(num_queries=5):
    return dict(layout='quick', queries=num_queries, batch=2, heads=2, head_dim=8, bias='local', window_size=7,
                seed=0, device='cpu', dtype='float32', backend='segment', **{'pass': 'fwd'})


def test_seed_loop_builds_the_structured_local_bias():
    case = _local_case()
    factors = build_bias_factors(case, torch.Generator().manual_seed(0))
    factors['visible'][:] = True  # the seed design has no visibility flag
    (_, bev_w), pers_shape = KEY_LAYOUTS['quick']
    pts_idx = factors['bev_centres'][..., 1] * bev_w + factors['bev_centres'][..., 2]
    seed = seed_local_bias_loop(factors['lidar_bias'] / 2 + 0.5, factors['camera_bias'] / 2 + 0.5, pts_idx,
                                factors['camera_centres'], KEY_LAYOUTS['quick'][0], pers_shape, 7, 1.0, 3)
    structured = make_bias(case, factors, 'cpu', False).to_dense()[:, 0]
    torch.testing.assert_close(seed[:, :3], structured[:, :3], rtol=0, atol=1e-6)
    assert not seed[:, 3:].any(), 'the loop only fills the queries it was asked for'


def test_options_fill_in_the_defaults_of_each_mode():
    main = BenchmarkOptions().resolved()
    assert (main.layouts, main.queries, main.batch_sizes, main.dtype, main.memory) == (
        ['r50', 'vov'], [900, 1800], [1, 2], 'float32', 'rss')
    assert main.backends == ['segment', 'segment+recompute', 'flashbias', 'sdpa'] and main.min_sample_ms == 0.0
    crossover = BenchmarkOptions(crossover=True, device='cuda').resolved()
    assert (crossover.layouts, crossover.batch_sizes, crossover.memory, crossover.no_construction) == (
        ['quick', 'demo', 'r50'], [2], 'none', True)
    assert crossover.min_sample_ms == 20.0 and crossover.dtype == 'float16'
    quick = BenchmarkOptions(quick=True, memory='rss').resolved()
    assert (quick.layouts, quick.queries, quick.repeats, quick.memory) == (['quick'], [32], 3, 'rss')


def test_crossover_has_a_row_per_case_and_marks_where_auto_switches(monkeypatch):
    # quick layout at its model's dims (bs 2 x 2 heads x Q x 312 keys): Q 2 -> 2 496 elements, Q 8 -> 9 984
    monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', dict.fromkeys(dispatch.DENSE_BIAS_MAX_ELEMENTS, 5000))
    result = run_attention_benchmark(BenchmarkOptions(crossover=True, layouts=['quick'], queries=[2, 8], repeats=1,
                                                      min_sample_ms=1))
    rows = result['crossover']
    assert sorted((r['bias'], r['pass'], r['queries']) for r in rows) == sorted(
        (bias, pass_name, q) for bias in ('global', 'local') for pass_name in ('fwd', 'fwdbwd') for q in (2, 8))
    for r in rows:
        assert (r['heads'], r['head_dim'], r['window_size'], r['batch']) == (2, 8, 5, 2)
        assert r['elements'] == 2 * 2 * r['queries'] * 312
        assert r['auto'] == ('sdpa' if r['queries'] == 2 else 'segment'), r['reason']
        assert r['ratios']['segment'] > 0 and r['ratios']['sdpa'] > 0
        assert (r['ratios']['flashbias'] is None) == (r['bias'] == 'local')
    header, table = benchmark_report(result).split('| bias | pass |', 1)
    assert 'DENSE_BIAS_MAX_ELEMENTS (segment fwd ≤ 5,000, segment fwdbwd ≤ 5,000' in header
    assert table.count('| 312 (quick) |') == 8 and table.count('| n/a |') == 4
    assert table.count('auto switches sdpa → segment') == 4
