"""diagnostics/gpu_run_stages.py: the stages' commands and the runner, with stand-in commands (no GPU, seconds)."""
import json

import pytest

from projects.mmdet3d_plugin.diagnostics import gpu_run_stages
from projects.mmdet3d_plugin.diagnostics.gpu_run_stages import run_stages, stage_commands, summary

STAND_INS = {'check': [['-c', 'print("checked")']],
             'accuracy': [['-c', 'import sys; print("bad"); sys.exit(3)']],
             'attention': [['-c', 'import time; print("slow", flush=True); time.sleep(60)']],
             'model': [['-c', 'print("never")']]}


def test_the_json_files_the_targets_read_are_written_by_the_stages():
    commands = stage_commands('OUT', 'd', 'w')
    outs = [args[args.index('--out') + 1] for stage in commands.values() for args in stage if '--out' in args]
    assert {'OUT/model_half_bs1.json', 'OUT/model_half_bs2.json', 'OUT/attention_float16.json'} <= set(outs)
    assert [args[-1] for args in commands['model']] == [f'OUT/model_{dtype}_bs{batch}.json' for batch in (1, 2)
                                                        for dtype in ('half', 'float32')]
    half = [args for args in commands['model'] if 'half' in args[-1]]
    assert not any('--attention-dtype' in args for args in half)  # the default: float16 on CUDA


@pytest.mark.slow(seconds=8)
def test_runner_keeps_going_and_stops_at_the_deadline(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_run_stages, 'MIN_START_SECONDS', 1.5)
    results = run_stages(list(STAND_INS), STAND_INS, str(tmp_path), deadline=4)
    assert [result.status for result in results] == ['ok', 'failed (exit 3)', 'timed out', 'not run (deadline)']
    assert results[2].seconds == pytest.approx(4, abs=1)  # stopped at the deadline, not after its 60 s
    logs = {stage: (tmp_path / f'{stage}.log').read_text() for stage in STAND_INS}
    assert logs['check'].startswith('$ -c ') and 'checked' in logs['check'] and '[ok, ' in logs['check']
    assert 'bad' in logs['accuracy'] and '[failed (exit 3), ' in logs['accuracy']
    assert 'slow' in logs['attention'] and '[timed out, ' in logs['attention']
    assert logs['model'].splitlines()[1].startswith('not run: ')
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith('[gpu_run ')]
    assert len(progress) == 2 * len(STAND_INS)
    text = summary(results, str(tmp_path))
    statuses = [line.split(' | ')[2] for line in text.splitlines() if line.startswith('| ') and '`' in line]
    assert statuses == [result.status for result in results]
    assert '- commit: ' in text and '- GPU: ' in text and '## Targets' not in text  # no benchmark JSON


def test_summary_has_the_targets_of_the_benchmark_json(tmp_path):
    model = dict(settings=dict(batch_size=2), results=[
        dict(shape='r50', mode='inference', ratio=dict(median=1.02), peak_mib=dict(A=100.0, B=100.0))])
    (tmp_path / 'model_half_bs2.json').write_text(json.dumps(model))
    text = summary([], str(tmp_path))
    assert '| r50 inference bs 2: time B/A | 1.020 | 1.05 | yes |' in text.split('## Targets', 1)[1]
