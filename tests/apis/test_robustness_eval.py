"""apis/robustness_eval.py: the deltas against each routing's clean run and the Markdown table."""
import pytest

from projects.mmdet3d_plugin.apis.robustness_eval import CorruptionResult, add_deltas, markdown_table


def _table_rows(markdown: str):
    """Cells of the table rows (header and separator skipped) of a Markdown report."""
    lines = [line for line in markdown.splitlines() if line.startswith('|')]
    return [[cell.strip() for cell in line.strip('|').split('|')] for line in lines[2:]]


def test_deltas_and_table_against_clean():
    results = [CorruptionResult('clean', 'ok', mAP=0.5, NDS=0.6), CorruptionResult('fov:120', 'ok', mAP=0.3, NDS=0.45),
               CorruptionResult('lidar_drop', 'failed', error='ValueError: no | point\nat all')]
    add_deltas(results)
    assert results[1].delta_mAP == pytest.approx(-0.2) and results[1].delta_NDS == pytest.approx(-0.15)
    assert results[0].delta_NDS == 0.0 and results[2].delta_mAP is None
    rows = _table_rows(markdown_table(results))
    assert rows[1] == ['fov:120', '0.3000', '0.4500', '-0.2000', '-0.1500', 'ok']
    # the pipe of the error is escaped: the row keeps its six cells
    assert markdown_table(results).splitlines()[-1].endswith('| failed: ValueError: no \\| point at all |')

    without_clean = [CorruptionResult('fov:120', 'ok', mAP=0.3, NDS=0.45)]
    add_deltas(without_clean)
    assert without_clean[0].delta_mAP is None
