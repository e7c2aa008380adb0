"""experiments/lie_probe_report.py: the table, the decision per family and the files."""
import json

from projects.mmdet3d_plugin.experiments.lie_probe_report import decision_line, decisions, markdown_table, write_report


def _row(family, features, ghost):
    score = dict(balanced_accuracy=ghost, positives=10, negatives=90)
    nan = dict(balanced_accuracy=float('nan'), positives=0, negatives=100)
    return dict(family=family, features=features, dims=4, epochs=dict(lidar=1, camera=2),
                scores=dict(ghost=score, yaw=score, all_lidar=score, all_camera=nan))


ROWS = [_row('mlp', 'router', 0.60), _row('mlp', 'router+disagreement', 0.72),
        _row('logistic', 'router', 0.60), _row('logistic', 'router+disagreement', 0.65)]


def test_each_family_is_decided_on_its_ghost_gain():
    verdicts = decisions(ROWS)
    assert verdicts['mlp']['go'] and abs(verdicts['mlp']['gain'] - 0.12) < 1e-9
    assert not verdicts['logistic']['go']
    line = decision_line(ROWS)
    assert '>= 0.10' in line and 'mlp: (b) - (a) = +0.120 on ghost queries (go on)' in line
    assert 'logistic: (b) - (a) = +0.050 on ghost queries (stop)' in line


def test_table_has_a_row_per_probe_with_positives_and_negatives(tmp_path):
    lines = markdown_table(ROWS)
    assert len(lines) == 2 + 4
    assert lines[3].startswith('| (b) router + disagreement, mlp (4 inputs) | 0.720 (10 / 90) |')
    assert lines[3].endswith('| n/a (0 / 100) |')
    text = write_report(ROWS, str(tmp_path / 'report'), 'python tools/probe_lie_router.py c x', 'Setup.')
    assert '`python tools/probe_lie_router.py c x`' in text and lines[3] in text
    written = json.loads((tmp_path / 'report' / 'lie_probe.json').read_text())
    assert written['decisions']['mlp']['go'] and len(written['rows']) == 4
    assert (tmp_path / 'report' / 'lie_probe.md').read_text() == text
