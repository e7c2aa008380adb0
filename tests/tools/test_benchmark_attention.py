"""tools/benchmark_attention.py --quick: every backend reported, the JSON written with the command line."""
import json

from projects.mmdet3d_plugin.diagnostics.attention_cases import BASELINE
from projects.mmdet3d_plugin.attention import dispatch
from tools import benchmark_attention


def test_quick_run_reports_each_backend(tmp_path, capsys):
    out = tmp_path / 'bench.json'
    result = benchmark_attention.main(['--quick', '--biases', 'global', 'local', '--passes', 'fwd', '--repeats', '1',
                                       '--backends', 'segment', 'segment+recompute', 'flashbias',
                                       '--seed-loop-queries', '1', '--out', str(out)])
    rows = {(r['bias'], r['backend']): r for r in result['attention']}
    assert rows[('global', 'segment')]['status'] == 'ok' and rows[('global', 'segment')]['ratio'] > 0
    assert rows[('global', BASELINE)]['ratio'] == 1.0
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
    text = capsys.readouterr().out
    assert '| keys (layout) | Q | bs | bias | pass | backend | median | x bias-free SDPA | peak memory |' in text
    assert "auto picks 'segment' for the global bias" in text


def test_slot_formulation_switch_runs_the_local_bias_through_it(monkeypatch, slot_formulations_used):
    """``--slot-formulation gather`` on the CPU: the segment backend's window products take it, the meta says so."""
    from projects.mmdet3d_plugin.attention.slots import window_slots
    monkeypatch.setitem(window_slots.FORMULATIONS, 'cpu', 'sparse')  # restored after the test
    result = benchmark_attention.main(['--quick', '--biases', 'local', '--passes', 'fwd', '--repeats', '1',
                                       '--backends', 'segment', '--no-construction', '--memory', 'none',
                                       '--slot-formulation', 'gather'])
    assert result['meta']['slot_formulation'] == 'gather'
    assert slot_formulations_used and set(slot_formulations_used) == {'gather'}
