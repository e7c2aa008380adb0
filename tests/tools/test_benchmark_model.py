"""tools/benchmark_model.py on tiny shapes: every table row is there and filled.

Correctness only: nothing here asserts a speed. The run uses the demo pair
(``configs/demo/cmt_synthetic_tiny.py`` vs its AQR twin, ``--tiny``): the
R50 pair's training step takes seconds per run on two CPU cores
(tests/apis/test_model_benchmark.py checks its configs without running them).
"""
import json

import pytest

from projects.mmdet3d_plugin.diagnostics import model_benchmark
from projects.mmdet3d_plugin.diagnostics.model_benchmark import (TOTAL_ROW, TRAIN_ROWS, ModelBenchmarkOptions,
                                                                 load_config)
from tools import benchmark_model

DEMO_PAIR = ('configs/demo/cmt_synthetic_tiny.py', 'configs/demo/cmt_aqr_synthetic_tiny.py')
AQR_ROWS = ('  AQR weight generator', '  AQR bias generator')
MODULE_ROWS = ('img_backbone', 'img_neck', 'pts_voxel_layer', 'pts_voxel_encoder', 'pts_middle_encoder',
               'pts_backbone', 'pts_neck', 'head', '  transformer')
TRAIN_ONLY_ROWS = ('loss (matching included)', '  assigner (Hungarian matching)') + TRAIN_ROWS
PAIRS = 2


def _table_label(row: str) -> str:
    """A row's name as the table prints it (one '· ' per level of nesting)."""
    return '· ' * ((len(row) - len(row.lstrip())) // 2) + row.lstrip()


@pytest.mark.slow(seconds=25)
def test_tiny_benchmark_has_every_row(tmp_path, capsys, monkeypatch):
    kept = []  # the allocator setting is asked for, not made: it would stay with this test process
    monkeypatch.setattr(model_benchmark, 'keep_freed_memory', lambda: kept.append(True) or True)
    out = tmp_path / 'bench.json'
    report = benchmark_model.main(['--configs', *DEMO_PAIR, '--tiny', '--pairs', str(PAIRS), '--warmup', '0',
                                   '--keep-freed-memory', '--out', str(out)])
    text = capsys.readouterr().out
    assert json.loads(out.read_text())['results'] == json.loads(json.dumps(report['results']))
    assert kept and report['allocator'] == 'freed host memory kept (glibc mallopt)'
    assert report['allocator'] in text.splitlines()[0]
    num_layers = load_config(DEMO_PAIR[0], ModelBenchmarkOptions(tiny=True).resolved()) \
        .model.pts_bbox_head.transformer.decoder.num_layers
    attention_rows = tuple(f'    decoder layer {i} {kind}' for i in range(num_layers)
                           for kind in ('self_attn', 'cross_attn'))
    results = {result['mode']: result for result in report['results']}
    assert sorted(results) == ['inference', 'train']
    progress = [line for line in text.splitlines() if line.startswith('  pair ')]  # one line per pair and mode
    assert [line.split(':')[0] for line in progress] == [f'  pair {i + 1}/{PAIRS}' for i in range(PAIRS)] * 2
    for mode, result in results.items():
        ratio = result['ratio']
        times_a, times_b = result['times_ms']['A'], result['times_ms']['B']
        assert len(times_a) == len(times_b) == PAIRS and min(times_a + times_b) > 0
        assert ratio['pairs'] == pytest.approx([b / a for a, b in zip(times_a, times_b)])
        assert 0 < ratio['min'] <= ratio['median'] <= ratio['max']
        assert result['peak_mib']['A'] > 0 and result['peak_mib']['B'] > 0
        summary = [line for line in text.splitlines() if line.startswith(f'| custom | {mode} | ')]
        assert len(summary) == 1
        # each model's attention kernels and precision: float32 on the CPU, one call per decoder layer and run
        for side, kernels in zip(summary[0].split(' | ')[2:4], result['attention']):
            assert kernels and all(name.endswith(' float32') for name in kernels), kernels
            assert sum(kernels.values()) == num_layers if mode == 'inference' else sum(kernels.values()) >= num_layers
            assert side == ', '.join(f'{name} ×{count:g}' for name, count in kernels.items())
        assert f'| {ratio["median"]:.3f} [{ratio["min"]:.3f}, {ratio["max"]:.3f}] |' in summary[0]
        assert summary[0].endswith(f'| {result["peak_mib"]["A"]:.0f} MiB | {result["peak_mib"]["B"]:.0f} MiB |')

        a_parts, b_parts = result['parts_ms']
        expected = MODULE_ROWS + attention_rows + (TRAIN_ONLY_ROWS if mode == 'train' else ())
        for row in expected:
            assert a_parts[row] > 0 and b_parts[row] > 0, (mode, row)
            assert f'| {_table_label(row)} | ' in text
        for row in AQR_ROWS:  # CMT has no AQR: its cell is empty
            assert row not in a_parts and b_parts[row] > 0, (mode, row)
            assert f'| {_table_label(row)} | — | ' in text
        if mode == 'inference':
            assert not set(TRAIN_ONLY_ROWS) & (set(a_parts) | set(b_parts))
        rows = result['part_rows']
        assert sorted(rows) == sorted(expected + AQR_ROWS + (TOTAL_ROW, ))
        assert rows.index('head') < rows.index(AQR_ROWS[0]) < rows.index('  transformer') < rows.index(
            attention_rows[0])
        for side, times in zip(result['parts_ms'], (times_a, times_b)):
            assert side[TOTAL_ROW] == pytest.approx(sum(times) / PAIRS)
            # every part runs inside the run; nested parts inside their parent
            assert max(side.values()) == side[TOTAL_ROW]
            assert side['  transformer'] <= side['head']
            assert sum(side[row] for row in attention_rows) <= side['  transformer']
        if mode == 'train':
            for side in result['parts_ms']:
                assert side['  assigner (Hungarian matching)'] <= side['loss (matching included)']
                assert sum(side[row] for row in TRAIN_ROWS) <= side[TOTAL_ROW]
