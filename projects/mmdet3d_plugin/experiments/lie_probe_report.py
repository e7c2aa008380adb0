"""The lie probe's table, decision and files (``lie_probe.md``, ``lie_probe.json``).

One row per probe family and feature set ((a) ``router``, (b) ``router+disagreement``): the balanced accuracy on
the validation split's ghost queries (LiDAR lies), yawed-view queries (camera lies) and all queries (each target),
each with its positives / negatives. The decision (:func:`.lie_probe.step0_decision`) reads the first family's
ghost column.
"""
import json
import math
import os
import os.path as osp
from typing import Dict, List, Sequence

from .lie_probe import MIN_GHOST_GAIN, step0_decision

#: Table columns: score key -> title.
COLUMNS = dict(ghost='ghost queries (LiDAR lies)', yaw='yawed-view queries (camera lies)',
               all_lidar='all queries, LiDAR lies', all_camera='all queries, camera lies')
FEATURE_LABELS = {'router': '(a) router', 'router+disagreement': '(b) router + disagreement'}


def _cell(score: dict) -> str:
    accuracy = score['balanced_accuracy']
    value = 'n/a' if accuracy is None or math.isnan(accuracy) else f'{accuracy:.3f}'
    return f'{value} ({score["positives"]} / {score["negatives"]})'


def decisions(rows: Sequence[dict]) -> Dict[str, dict]:
    """Per family: ``(a)`` and ``(b)``'s ghost accuracies, the gain and whether the design goes on."""
    result = {}
    for family in dict.fromkeys(row['family'] for row in rows):
        ghost = {row['features']: row['scores']['ghost']['balanced_accuracy'] for row in rows
                 if row['family'] == family}
        go, gain = step0_decision(ghost['router'], ghost['router+disagreement'])
        result[family] = dict(router=ghost['router'], disagreement=ghost['router+disagreement'], gain=gain, go=go)
    return result


def markdown_table(rows: Sequence[dict]) -> List[str]:
    """The table's lines: balanced accuracy (positives / negatives) per probe and column."""
    lines = ['| probe | ' + ' | '.join(COLUMNS.values()) + ' |', '|---|' + '---:|' * len(COLUMNS)]
    for row in rows:
        label = f'{FEATURE_LABELS.get(row["features"], row["features"])}, {row["family"]} ({row["dims"]} inputs)'
        lines.append(f'| {label} | ' + ' | '.join(_cell(row['scores'][key]) for key in COLUMNS) + ' |')
    return lines


def decision_line(rows: Sequence[dict]) -> str:
    """One sentence per family: (b) - (a) on ghost queries against the rule, first family decisive."""
    parts = []
    for family, verdict in decisions(rows).items():
        parts.append(f'{family}: (b) - (a) = {verdict["gain"]:+.3f} on ghost queries '
                     f'({"go on" if verdict["go"] else "stop"})')
    return f'Decision rule: (b) must beat (a) by >= {MIN_GHOST_GAIN:.2f} balanced accuracy on ghost queries; ' + \
        '; '.join(parts) + '.'


def write_report(rows: Sequence[dict], out: str, command: str, setup: str) -> str:
    """Write ``lie_probe.md`` and ``lie_probe.json`` to ``out``; the Markdown text."""
    os.makedirs(out, exist_ok=True)
    text = '\n'.join(['# Can the router see a lie? A probe of its inputs', '', f'`{command}`', '', setup, '',
                      *markdown_table(rows), '', decision_line(rows), ''])
    with open(osp.join(out, 'lie_probe.md'), 'w') as f:
        f.write(text)
    with open(osp.join(out, 'lie_probe.json'), 'w') as f:
        json.dump(dict(command=command, setup=setup, rows=list(rows), decisions=decisions(rows)), f, indent=2)
    return text
