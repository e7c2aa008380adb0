"""tools/compare_attention_precision.py on the CPU: the demo config at tiny shapes, its exit status and JSON."""
import json

import pytest
import torch

from projects.mmdet3d_plugin.diagnostics import precision_comparison
from projects.mmdet3d_plugin.diagnostics.model_benchmark import ModelBenchmarkOptions, build_detector, load_config
from tools import compare_attention_precision

DEMO_CONFIG = 'configs/demo/cmt_aqr_synthetic_tiny.py'


def test_a_checkpoint_is_compared_and_written_as_json(tmp_path, capsys):
    options = ModelBenchmarkOptions(tiny=True).resolved()
    model = build_detector(load_config(DEMO_CONFIG, options), seed=5)
    checkpoint = tmp_path / 'trained.pth'
    torch.save(dict(meta=dict(), state_dict=model.state_dict()), checkpoint)
    out = tmp_path / 'rows.json'
    status = compare_attention_precision.main(['--configs', DEMO_CONFIG, '--checkpoint', str(checkpoint), '--tiny',
                                               '--out', str(out)])
    text = capsys.readouterr().out
    assert status == 0 and text.rstrip().endswith('compare_attention_precision passed')
    rows = json.loads(out.read_text())['rows']
    assert [(row['run'], row['weights']) for row in rows] == [('float32 again', str(checkpoint)),
                                                              ('float16', str(checkpoint))]
    assert f'| {DEMO_CONFIG} | {checkpoint} | float16 | ' in text


def test_a_run_beyond_its_tolerance_fails_with_the_metric_named(monkeypatch, capsys):
    monkeypatch.setitem(precision_comparison.TOLERANCES, 'float16',
                        dict(precision_comparison.TOLERANCES['float16'], centre_m=0.0))
    status = compare_attention_precision.main(['--configs', DEMO_CONFIG, '--tiny'])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    assert lines[-2] == 'compare_attention_precision FAILED (1):'
    assert lines[-1].startswith(f'  {DEMO_CONFIG} float16: centre_m ') and lines[-1].endswith(' > 0')


@pytest.mark.parametrize('args, message', [
    (['--configs', 'a.py', 'b.py', '--checkpoint', 'c.pth'], '--checkpoint needs exactly one config'),
    (['--batch-size', '0'], '--batch-size must be >= 1'),
    (['--dtypes', 'float32'], "invalid choice: 'float32'"),
])
def test_bad_options_are_refused(args, message, capsys):
    with pytest.raises(SystemExit):
        compare_attention_precision.parse_args(args)
    assert message in capsys.readouterr().err
