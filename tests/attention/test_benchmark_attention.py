"""tools/benchmark_attention.py: its seed-loop baseline builds the same bias, a quick run reports every case, and
``--crossover`` tabulates every size with the pick of ``auto`` and marks where it switches."""
import json

import torch

from projects.mmdet3d_plugin.attention import dispatch
from tools import benchmark_attention as bench


def _local_case(num_queries=5):
    return dict(layout='quick', queries=num_queries, batch=2, heads=2, head_dim=8, bias='local', window_size=7,
                seed=0, device='cpu', dtype='float32', backend='segment', **{'pass': 'fwd'})


def test_seed_loop_builds_the_structured_local_bias():
    case = _local_case()
    factors = bench.build_bias_factors(case, torch.Generator().manual_seed(0))
    factors['visible'][:] = True  # the seed design has no visibility flag
    (_, bev_w), pers_shape = bench.KEY_LAYOUTS['quick']
    pts_idx = factors['bev_centres'][..., 1] * bev_w + factors['bev_centres'][..., 2]
    seed = bench.seed_local_bias_loop(factors['lidar_bias'] / 2 + 0.5, factors['camera_bias'] / 2 + 0.5, pts_idx,
                                      factors['camera_centres'], bench.KEY_LAYOUTS['quick'][0], pers_shape, 7, 1.0, 3)
    structured = bench.make_bias(case, factors, 'cpu', False).to_dense()[:, 0]
    torch.testing.assert_close(seed[:, :3], structured[:, :3], rtol=0, atol=1e-6)
    assert not seed[:, 3:].any(), 'the loop only fills the queries it was asked for'


def test_quick_run_reports_each_backend(tmp_path):
    out = tmp_path / 'bench.json'
    result = bench.main(['--quick', '--biases', 'global', 'local', '--passes', 'fwd', '--repeats', '1',
                         '--backends', 'segment', 'segment+recompute', 'flashbias', '--seed-loop-queries', '1',
                         '--out', str(out)])
    rows = {(r['bias'], r['backend']): r for r in result['attention']}
    assert rows[('global', 'segment')]['status'] == 'ok' and rows[('global', 'segment')]['ratio'] > 0
    assert rows[('global', bench.BASELINE)]['ratio'] == 1.0
    assert all(rows[(bias, 'segment+recompute')]['status'] == 'ok' for bias in ('global', 'local'))
    assert rows[('local', 'flashbias')]['status'] == 'n/a' and 'WindowBias' in rows[('local', 'flashbias')]['reason']
    methods = {r['method'] for r in result['construction']}
    assert methods >= {'structured AttentionBias', 'dense to_dense() (vectorised)', 'seed per-query Python loop (dense)'}
    # fwd+bwd, 1 x 8 heads x 32 queries x 312 keys = 79 872 elements: above the global bias's threshold, below the
    # local one's
    assert dispatch.DENSE_BIAS_MAX_ELEMENTS['segment', 'fwdbwd'] < 79872 <= dispatch.DENSE_BIAS_MAX_ELEMENTS[
        'window', 'fwdbwd']
    assert result['auto'] == {'global': ['segment', result['auto']['global'][1]],
                              'local': ['sdpa', result['auto']['local'][1]]}
    assert json.loads(out.read_text())['meta']['command'].startswith('tools/benchmark_attention.py --quick')


def test_crossover_has_a_row_per_case_and_marks_where_auto_switches(monkeypatch, capsys):
    # quick layout at its model's dims (bs 2 x 2 heads x Q x 312 keys): Q 2 -> 2 496 elements, Q 8 -> 9 984
    monkeypatch.setattr(dispatch, 'DENSE_BIAS_MAX_ELEMENTS', dict.fromkeys(dispatch.DENSE_BIAS_MAX_ELEMENTS, 5000))
    result = bench.main(['--crossover', '--layouts', 'quick', '--queries', '2', '8', '--repeats', '1',
                         '--min-sample-ms', '1'])
    rows = result['crossover']
    assert sorted((r['bias'], r['pass'], r['queries']) for r in rows) == sorted(
        (bias, pass_name, q) for bias in ('global', 'local') for pass_name in ('fwd', 'fwdbwd') for q in (2, 8))
    for r in rows:
        assert (r['heads'], r['head_dim'], r['window_size'], r['batch']) == (2, 8, 5, 2)
        assert r['elements'] == 2 * 2 * r['queries'] * 312
        assert r['auto'] == ('sdpa' if r['queries'] == 2 else 'segment'), r['reason']
        assert r['ratios']['segment'] > 0 and r['ratios']['sdpa'] > 0
        assert (r['ratios']['flashbias'] is None) == (r['bias'] == 'local')
    header, table = capsys.readouterr().out.split('| bias | pass |', 1)
    assert 'DENSE_BIAS_MAX_ELEMENTS (segment fwd ≤ 5,000, segment fwdbwd ≤ 5,000' in header
    assert table.count('| 312 (quick) |') == 8 and table.count('| n/a |') == 4
    assert table.count('auto switches sdpa → segment') == 4
