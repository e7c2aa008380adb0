"""tools/benchmark_attention.py: its seed-loop baseline builds the same bias, and a quick run reports every case."""
import json

import torch

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
    assert result['auto'] == {'global': ['segment', result['auto']['global'][1]],
                              'local': ['segment', result['auto']['local'][1]]}
    assert json.loads(out.read_text())['meta']['command'].startswith('tools/benchmark_attention.py --quick')
