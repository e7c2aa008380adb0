"""tools/analyze_box_errors.py: a checkpoint's per-class heading and velocity errors on its first test samples."""
from tools import analyze_box_errors


def test_the_tool_prints_a_row_per_matched_class_and_one_for_all(demo_checkpoint, capsys):
    config, checkpoint = demo_checkpoint('cmt_aqr_synthetic_tiny')
    table = analyze_box_errors.main([config, checkpoint, '--samples', '2', '--score-thr', '0.0', '--max-distance',
                                     '60'])
    lines = table.splitlines()
    assert lines[0].startswith('| class | matched | right < 45° | sideways | flipped > 135°')
    assert lines[-1].startswith('| all |')
    shares = [float(cell) for cell in lines[-1].split('|')[3:6]]
    assert abs(sum(shares) - 1.0) < 0.011
    assert table in capsys.readouterr().out
