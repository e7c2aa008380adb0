"""The package's code says what it does: short modules and module docstrings, no benchmark machine named in it.

Measured numbers, and the machines they were measured on, belong in docs/results.md, where a reader sees the
date and the command; in code they go stale silently.
"""
import ast
import re
from pathlib import Path
from typing import List

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / 'projects'
#: most lines of a module docstring: what the module is, its inputs and outputs with shapes, why
MAX_MODULE_DOCSTRING_LINES = 25
#: most lines of a module of the package: one concept per file
MAX_MODULE_LINES = 500
#: machines benchmarks ran on, which code must not name
MACHINE_NAMES = re.compile(r'H200|H100|A100|EPYC|Xeon')


def _files(root: Path, pattern: str) -> List[Path]:
    return [path for path in sorted(root.rglob(pattern)) if path.is_file() and '__pycache__' not in path.parts]


def long_module_docstrings(root: Path = PACKAGE_ROOT) -> List[str]:
    """``'<path>: <n> lines'`` (path from ``root``'s parent) for every module under ``root`` whose docstring is
    over :data:`MAX_MODULE_DOCSTRING_LINES` lines."""
    found = []
    for path in _files(root, '*.py'):
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding='utf-8'), str(path)), clean=False)
        lines = len(docstring.splitlines()) if docstring else 0
        if lines > MAX_MODULE_DOCSTRING_LINES:
            found.append(f'{path.relative_to(root.parent)}: {lines} lines')
    return found


def long_modules(root: Path = PACKAGE_ROOT) -> List[str]:
    """``'<path>: <n> lines'`` (path from ``root``'s parent) for every module under ``root`` over
    :data:`MAX_MODULE_LINES` lines."""
    found = []
    for path in _files(root, '*.py'):
        lines = len(path.read_text(encoding='utf-8').splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f'{path.relative_to(root.parent)}: {lines} lines')
    return found


def machine_name_mentions(root: Path = PACKAGE_ROOT) -> List[str]:
    """``'<path>:<line>: <text>'`` (path from ``root``'s parent) for every line of a file under ``root``, of any
    kind, that names a benchmark machine."""
    found = []
    for path in _files(root, '*'):
        text = path.read_bytes().decode('utf-8', errors='replace')
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_NAMES.search(line):
                found.append(f'{path.relative_to(root.parent)}:{number}: {line.strip()}')
    return found


def test_module_docstrings_are_short():
    long = long_module_docstrings()
    assert not long, (f'module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (say what the module is, its '
                      'inputs and outputs, why; measurements go to docs/results.md):\n' + '\n'.join(long))


def test_modules_are_short():
    long = long_modules()
    assert not long, f'modules over {MAX_MODULE_LINES} lines (split a concept into a file of its own):\n' + \
        '\n'.join(long)


def test_no_machine_names_in_code():
    mentions = machine_name_mentions()
    assert not mentions, ('benchmark machines named under projects/ (measurements go to docs/results.md):\n' +
                          '\n'.join(mentions))


def test_the_checks_find_what_they_look_for(tmp_path):
    root = tmp_path / 'package'
    root.mkdir()
    (root / 'long.py').write_text('"""' + 'line\n' * (MAX_MODULE_DOCSTRING_LINES + 1) + '"""\n')
    (root / 'short.py').write_text('"""' + 'line\n' * (MAX_MODULE_DOCSTRING_LINES - 1) + 'line"""\n')
    (root / 'kernel.cpp').write_text('// plain C++\n// tuned on an H100\n')
    (root / 'big.py').write_text('x = 1\n' * (MAX_MODULE_LINES + 1))
    (root / 'full.py').write_text('x = 1\n' * MAX_MODULE_LINES)
    assert long_module_docstrings(root) == [f'package/long.py: {MAX_MODULE_DOCSTRING_LINES + 1} lines']
    assert long_modules(root) == [f'package/big.py: {MAX_MODULE_LINES + 1} lines']
    assert machine_name_mentions(root) == ['package/kernel.cpp:2: // tuned on an H100']
