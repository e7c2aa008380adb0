"""diagnostics/gpu_targets.py: the rows read from benchmark reports, each against its limit."""
from projects.mmdet3d_plugin.diagnostics.gpu_targets import attention_target_rows, model_target_rows, targets_table


def _record(backend, bias='local', layout='vov', status='ok', ratio=1.4, batch=1):
    return dict(layout=layout, batch=batch, queries=900, bias=bias, dtype='float16', backend=backend, status=status,
                ratio=ratio, **{'pass': 'fwdbwd'})


def test_model_rows_time_per_mode_and_peak_memory():
    report = dict(settings=dict(batch_size=1), results=[
        dict(shape='r50', mode='inference', ratio=dict(median=1.02), peak_mib=dict(A=100.0, B=120.0)),
        dict(shape='vov', mode='train', ratio=dict(median=1.2), peak_mib=dict(A=None, B=None))])
    assert targets_table(model_target_rows(report)).splitlines()[2:] == [
        '| r50 inference bs 1: time B/A | 1.020 | 1.05 | yes |',
        '| r50 inference bs 1: peak memory B/A | 1.200 | 1.15 | NO |',
        '| vov train bs 1: time B/A | 1.200 | 1.1 | NO |',
        '| vov train bs 1: peak memory B/A | n/a | 1.15 | NO |']


def test_attention_rows_are_the_local_bias_in_tiled_bias_only():
    report = dict(attention=[_record('tiled_bias'), _record('sdpa', ratio=3.0), _record('tiled_bias', bias='global'),
                             _record('tiled_bias', layout='r50'), _record('tiled_bias', status='n/a', batch=2)])
    rows = attention_target_rows(report)
    assert [(row['measured'], row['met']) for row in rows] == [(1.4, True), (None, False)]
    assert rows[0]['target'] == 'vov bs 1 Q 900 local bias fwd+bwd float16: tiled_bias / bias-free SDPA'
