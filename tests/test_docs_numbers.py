"""Numbers quoted outside docs/results.md come from it: README's demo table against results.md's demo tables.

docs/results.md holds every measured number with its command; README.md quotes the demo's in a table, one row per
demo model (named by ``make demo`` or ``MODEL=<model>`` in backticks) and one column per metric (``mAP``, ``mAP
without LiDAR``, ``mAP without cameras``, ``wall time``). Every number of a README cell must stand in a cell of
results.md's "Demo" section for the same model and metric: in a table with a column per model and a row per metric,
or with a row per model and a column per metric (``clean`` is the mAP, ``lidar_drop`` the mAP without LiDAR).
"""
import os
import re
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = re.compile(r'\d+\.\d+')
MODEL_SPAN = re.compile(r'`(make demo(?: MODEL=(\w+))?|MODEL=(\w+))`')
#: a metric's names in the tables -> the metric
METRICS = (('lidar_drop', ('lidar_drop', 'without lidar')), ('camera_drop', ('camera_drop', 'without cameras')),
           ('wall time', ('wall time', )), ('NDS', ('nds', )), ('mAP', ('map', 'clean')))
DEFAULT_MODEL = 'cmt_aqr'


def read(name: str, root: str = REPO_ROOT) -> str:
    """The text of ``name``, a path relative to ``root``."""
    with open(os.path.join(root, name), encoding='utf-8') as f:
        return f.read()


def section(text: str, heading: str) -> str:
    """The text under the level-2 ``heading`` of a Markdown page, up to the next level-2 heading."""
    parts = re.split(r'^## ', text, flags=re.MULTILINE)
    found = [part for part in parts if part.startswith(heading + '\n')]
    return found[0] if found else ''


def tables(text: str) -> List[List[List[str]]]:
    """The Markdown tables of ``text``: rows of cells, the separator row left out."""
    found, rows = [], []
    for line in text.splitlines() + ['']:
        if line.startswith('|'):
            cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
            if not all(re.fullmatch(r':?-+:?', cell) for cell in cells):
                rows.append(cells)
        elif rows:
            found, rows = found + [rows], []
    return found


def model_of(cell: str, strict: bool) -> Optional[str]:
    """The demo model a cell names (``make demo``: :data:`DEFAULT_MODEL`); ``strict``: only a cell that starts with
    it, followed by nothing or a parenthesis (a variant, ``MODEL=x, --cfg-options ...``, names none)."""
    text = cell.replace('*', '').strip()
    match = MODEL_SPAN.match(text) if strict else MODEL_SPAN.search(text)
    if match is None or (strict and text[match.end():].strip()[:1] not in ('', '(')):
        return None
    return match.group(2) or match.group(3) or DEFAULT_MODEL


def metric_of(label: str) -> Optional[str]:
    """The metric (a name of :data:`METRICS`) a table's row or column label names, if any."""
    label = label.replace('*', '').lower()
    return next((metric for metric, names in METRICS if any(name.lower() in label for name in names)), None)


def results_cells(results: str) -> Dict[Tuple[str, str], List[str]]:
    """(model, metric) -> the cells of results.md's Demo section that hold it."""
    cells = defaultdict(list)
    for table in tables(section(results, 'Demo')):
        header = table[0]
        columns = {index: model_of(cell, strict=True) for index, cell in enumerate(header)}
        for row in table[1:]:
            row_model, row_metric = model_of(row[0], strict=True), metric_of(row[0])
            for index, cell in enumerate(row[1:len(header)], 1):
                if columns.get(index) and row_metric:
                    cells[columns[index], row_metric].append(cell)
                if row_model and metric_of(header[index]):
                    cells[row_model, metric_of(header[index])].append(cell)
    return cells


def unsourced_numbers(readme: str, results: str) -> List[str]:
    """The numbers of README's Results table that results.md's Demo section does not have for that model and
    metric, as ``'<model> / <metric>: <number>'``."""
    cells = results_cells(results)
    problems = []
    for table in tables(section(readme, 'Results')):
        header = table[0]
        for row in table[1:]:
            model = model_of(row[0], strict=False)
            for label, cell in zip(header[1:], row[1:]):
                sources = ' '.join(cells.get((model, metric_of(label)), []))
                problems += [f'{model} / {label}: {number}' for number in NUMBER.findall(cell)
                             if number not in NUMBER.findall(sources)]
    return problems


def test_readme_demo_numbers_are_those_of_results_md():
    readme, results = read('README.md'), read(os.path.join('docs', 'results.md'))
    assert tables(section(readme, 'Results')), "README's Results section has no table"
    problems = unsourced_numbers(readme, results)
    assert problems == [], 'README quotes numbers that docs/results.md does not have:\n' + '\n'.join(problems)


def test_the_check_finds_a_number_results_md_no_longer_has():
    results = ('# Results\n\n## Demo\n\n| metric | untrained | **`make demo`** (AQR) | `MODEL=cmt` |\n'
               '|---|---:|---:|---:|\n| mAP | 0.000 | **0.618** | 0.007 |\n| mAP without LiDAR (`lidar_drop`) | | 0.157 | |\n\n'
               '| model | clean | `camera_drop` | wall time |\n|---|---:|---:|---:|\n'
               '| `MODEL=heading` | 0.5 / 0.6 (**0.55**) | 0.3 | 14.6 min |\n'
               '| `MODEL=heading`, `--cfg-options x=1` | 0.9 | 0.9 | |\n\n## Other\n\n| metric | `MODEL=cmt` |\n'
               '|---|---|\n| mAP | 0.5 |\n')
    readme = ('# X\n\n## Results\n\n| model | mAP | mAP without LiDAR | mAP without cameras | wall time |\n'
              '|---|---:|---:|---:|---:|\n| CMT-AQR (`make demo`) | **0.618** | 0.157 | – | |\n'
              '| heading (`MODEL=heading`), mean | 0.55 | | 0.3 | 14.6 min |\n| CMT (`MODEL=cmt`) | 0.007 | | | |\n')
    assert unsourced_numbers(readme, results) == []
    stale = readme.replace('0.157', '0.146').replace('| 0.55 |', '| 0.9 |').replace('0.007', '0.5')
    assert unsourced_numbers(stale, results) == ['cmt_aqr / mAP without LiDAR: 0.146', 'heading / mAP: 0.9',
                                                 'cmt / mAP: 0.5']
