"""tools/count_device_ops.py: the head's and optimizer step's device ops of two configs, without a GPU."""
import json

import pytest

from tools import count_device_ops


@pytest.mark.slow(seconds=15)
def test_counts_cmt_and_cmt_aqr_per_part(capsys, tmp_path):
    results = count_device_ops.main(['--tiny', '--out', str(tmp_path / 'counts.json')])
    (ops_a, _), (ops_b, _) = results['r50']['inference']['A'], results['r50']['inference']['B']
    assert 'AQR weight generator' not in ''.join(ops_a) and ops_b['  AQR weight generator'] > 0
    assert ops_b['head'] > ops_a['head'] > 0
    assert ops_a['    decoder layer 5 cross_attn'] > 0 and 'optimizer step' not in ops_a
    (train_a, _), (train_b, _) = results['r50']['train']['A'], results['r50']['train']['B']
    assert train_a['head'] > ops_a['head']  # denoising queries, the loss targets' encoding ...
    assert train_b['  AQR weight generator'] > ops_b['  AQR weight generator']  # its dropout
    # three parameter groups (MergedParamGroupsOptimizerConstructor): a few dozen foreach ops, not one set per tensor
    assert 0 < train_b['optimizer step'] < 100
    out = capsys.readouterr().out
    assert '| part | A device ops | B device ops | A / B host copies |' in out
    assert f"|   AQR weight generator | — | {ops_b['  AQR weight generator']} | — / " in out
    saved = json.loads((tmp_path / 'counts.json').read_text())
    assert saved['results']['r50']['train']['B'][0]['optimizer step'] == train_b['optimizer step']
    assert saved['settings']['tiny'] is True
