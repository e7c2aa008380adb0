"""The pages stay usable: links resolve, commands run, paths exist, pages stay short, backend lists are right.

Checked for README.md and every Markdown page under docs/ (subfolders included): every relative link points at an
existing file (and heading, for ``#anchor`` links); every command line shown runs a script that exists with flags
its parser accepts, every repository path named exists and no path outside the repository is named
(``doc_references.py``, read without running a tool); README.md has at most ``README_MAX_LINES`` lines and every
docs page at most ``DOCS_MAX_LINES``; the one line starting with ``Backends:`` in README.md, in docs/architecture.md
and in the docstring of ``apply_attention`` names (in backticks) exactly the registered backends
(``projects.mmdet3d_plugin.attention.BACKENDS``), ``auto`` allowed besides them.
"""
import ast
import os
import re
from typing import List, Optional

import pytest
from doc_references import command_problems, missing_paths, outside_paths

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
FENCE = re.compile(r'^```.*?^```', re.MULTILINE | re.DOTALL)
EXTERNAL = ('http://', 'https://', 'mailto:')
README_MAX_LINES = 150
DOCS_MAX_LINES = 300
DISPATCH = os.path.join('projects', 'mmdet3d_plugin', 'attention', 'dispatch.py')
BACKEND_LIST_PLACES = ('README.md', os.path.join('docs', 'architecture.md'), DISPATCH)


def markdown_pages(root: str = REPO_ROOT) -> List[str]:
    """README.md and every ``docs/**/*.md``, as paths relative to ``root``."""
    docs = []
    for folder, _, names in os.walk(os.path.join(root, 'docs')):
        docs += [os.path.relpath(os.path.join(folder, name), root) for name in names if name.endswith('.md')]
    return ['README.md'] + sorted(docs)


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def anchors(path: str) -> set:
    """The anchors of the headings of a Markdown file (outside code blocks)."""
    with open(path, encoding='utf-8') as f:
        text = FENCE.sub('', f.read())
    return {heading_anchor(line.lstrip('#')) for line in text.splitlines() if re.match(r'#{1,6} ', line)}


def broken_links(page: str, root: str = REPO_ROOT) -> List[str]:
    """The relative links of ``page`` (a path under ``root``) whose file or heading does not exist."""
    path = os.path.join(root, page)
    with open(path, encoding='utf-8') as f:
        text = FENCE.sub('', f.read())
    broken = []
    for target in LINK.findall(text):
        if target.startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition('#')
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            broken.append(f'{target} (no such file)')
        elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
            broken.append(f'{target} (no heading #{anchor})')
    return broken


def line_count(page: str, root: str = REPO_ROOT) -> int:
    """The number of lines of ``page`` (a path under ``root``)."""
    with open(os.path.join(root, page), encoding='utf-8') as f:
        return len(f.read().splitlines())


def too_long(root: str = REPO_ROOT) -> List[str]:
    """The pages over their line limit, as ``'page: N lines (limit L)'``."""
    found = []
    for page in markdown_pages(root):
        limit = README_MAX_LINES if page == 'README.md' else DOCS_MAX_LINES
        count = line_count(page, root)
        if count > limit:
            found.append(f'{page}: {count} lines (limit {limit})')
    return found


def documented_text(place: str, root: str = REPO_ROOT) -> str:
    """The text holding ``place``'s backend list: a page's text, or ``apply_attention``'s docstring for a .py file."""
    with open(os.path.join(root, place), encoding='utf-8') as f:
        text = f.read()
    if not place.endswith('.py'):
        return text
    functions = [node for node in ast.walk(ast.parse(text))
                 if isinstance(node, ast.FunctionDef) and node.name == 'apply_attention']
    return (ast.get_docstring(functions[0]) or '') if functions else ''


def backend_list(text: str) -> Optional[List[str]]:
    """The backticked names of the one line of ``text`` that starts with ``Backends:``; None without exactly one."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith('Backends:')]
    return re.findall(r'`([^`]+)`', lines[0]) if len(lines) == 1 else None


def backend_list_mismatch(names: Optional[List[str]], registered: List[str]) -> str:
    """Why ``names`` (a ``Backends:`` line) is not the list of ``registered`` backends; '' when it is."""
    if names is None:
        return 'no single line starting with "Backends:"'
    listed = [name for name in names if name != 'auto']
    if len(set(names)) != len(names):
        return f'a backend named twice: {names}'
    missing, unknown = sorted(set(registered) - set(listed)), sorted(set(listed) - set(registered))
    if missing or unknown:
        return f'missing {missing}, not registered {unknown}'
    return ''


@pytest.mark.parametrize('page', markdown_pages())
def test_relative_links_point_at_existing_files(page):
    assert broken_links(page) == [], f'{page} has broken links'


def test_pages_stay_within_their_line_limits():
    found = too_long()
    assert found == [], 'pages over their limit: ' + '; '.join(found)


@pytest.mark.parametrize('place', BACKEND_LIST_PLACES)
def test_backend_lists_name_the_registered_backends(place):
    from projects.mmdet3d_plugin.attention import BACKENDS
    mismatch = backend_list_mismatch(backend_list(documented_text(place)), list(BACKENDS))
    assert mismatch == '', f'{place}: {mismatch}'


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / 'docs' / 'sub').mkdir(parents=True)
    (tmp_path / 'docs' / 'a.md').write_text('# Real heading\n\n```\n[in code](nowhere.md)\n```\n')
    (tmp_path / 'docs' / 'sub' / 'b.md').write_text('[up](../a.md#real-heading) [gone](../c.md)\n')
    (tmp_path / 'README.md').write_text('[ok](docs/a.md#real-heading) [file](docs/missing.md) '
                                        '[anchor](docs/a.md#nope) [web](https://example.org/x)\n')
    root = str(tmp_path)
    sub_page = os.path.join('docs', 'sub', 'b.md')
    assert markdown_pages(root) == ['README.md', os.path.join('docs', 'a.md'), sub_page]
    assert broken_links('README.md', root) == ['docs/missing.md (no such file)', 'docs/a.md#nope (no heading #nope)']
    assert broken_links(os.path.join('docs', 'a.md'), root) == []
    assert broken_links(sub_page, root) == ['../c.md (no such file)']


def test_the_checker_finds_pages_over_their_limits(tmp_path):
    (tmp_path / 'docs' / 'sub').mkdir(parents=True)
    (tmp_path / 'README.md').write_text('line\n' * README_MAX_LINES)
    (tmp_path / 'docs' / 'sub' / 'long.md').write_text('line\n' * DOCS_MAX_LINES)
    assert too_long(str(tmp_path)) == []
    (tmp_path / 'README.md').write_text('line\n' * (README_MAX_LINES + 1))
    (tmp_path / 'docs' / 'sub' / 'long.md').write_text('line\n' * (DOCS_MAX_LINES + 1))
    assert too_long(str(tmp_path)) == [f'README.md: {README_MAX_LINES + 1} lines (limit {README_MAX_LINES})',
                                       f'docs/sub/long.md: {DOCS_MAX_LINES + 1} lines (limit {DOCS_MAX_LINES})']


def test_the_checker_reads_backend_lists_from_pages_and_docstrings(tmp_path):
    registered = ['math', 'sdpa', 'tiled_bias']
    source = 'def apply_attention(q):\n    """Attention.\n\n    Backends: `auto`, `math`, `sdpa`.\n    """\n'
    (tmp_path / 'dispatch.py').write_text(source)
    names = backend_list(documented_text('dispatch.py', str(tmp_path)))
    assert names == ['auto', 'math', 'sdpa']
    assert backend_list_mismatch(names, registered) == "missing ['tiled_bias'], not registered []"
    assert backend_list_mismatch(['math', 'sdpa', 'tiled_bias'], registered) == ''
    assert backend_list_mismatch(['auto', 'math', 'sdpa', 'tiled_bias', 'flex'], registered) == \
        "missing [], not registered ['flex']"
    assert backend_list_mismatch(backend_list('no list here'), registered).startswith('no single line')
    assert backend_list('Backends: `a`\nBackends: `b`') is None


@pytest.mark.parametrize('page', markdown_pages())
def test_commands_run_existing_scripts_with_options_they_accept(page):
    problems = command_problems(page, REPO_ROOT)
    assert problems == [], f'{page}: commands that would fail:\n' + '\n'.join(problems)


@pytest.mark.parametrize('page', markdown_pages())
def test_repository_paths_exist(page):
    missing = missing_paths(page, REPO_ROOT)
    assert missing == [], f'{page} names paths that do not exist: {missing}'


@pytest.mark.parametrize('page', markdown_pages())
def test_no_path_outside_the_repository(page):
    outside = outside_paths(page, REPO_ROOT)
    assert outside == [], f'{page} names paths a user of the repository does not have: {outside}'


def _fake_repo(root):
    """A repository with a tool (options partly from a helper module), a shell script passing its arguments to it,
    a Makefile running it, and a config."""
    for folder in ('tools/cli', 'configs/demo', 'docs', 'projects/mmdet3d_plugin/models'):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / 'tools' / 'cli' / '__init__.py').write_text('')
    (root / 'tools' / 'cli' / 'common.py').write_text(
        'def add_common(parser):\n    parser.add_argument("--seed", type=int)\n\n\n'
        'def unused(parser):\n    parser.add_argument("--not-train")\n')
    (root / 'tools' / 'train.py').write_text(
        'import argparse\nfrom tools.cli.common import add_common\n\n\n'
        'def parse_args():\n    parser = argparse.ArgumentParser()\n    parser.add_argument("config")\n'
        '    parser.add_argument("--work-dir", "--work_dir")\n    add_common(parser)\n    return parser.parse_args()\n')
    (root / 'tools' / 'dist_train.sh').write_text('#!/usr/bin/env bash\nCONFIG=$1\nshift\n'
                                                  'python "$(dirname "$0")/train.py" "$CONFIG" "$@"\n')
    (root / 'Makefile').write_text('MODEL ?= a\nTRAIN_ARGS ?=\n\ntrain:\n\tpython tools/train.py $(MODEL) '
                                   '$(TRAIN_ARGS)\n')
    (root / 'configs' / 'demo' / 'tiny.py').write_text('')
    (root / 'projects' / 'mmdet3d_plugin' / 'models' / 'head.py').write_text('')


SELF_TEST_PAGES = {
    'a misspelt flag, a missing script, a make typo': (
        command_problems, 'docs/a.md',
        '```bash\npython tools/train.py configs/demo/tiny.py --work-dir w \\\n    --seed 1  # ok\n'
        'bash tools/dist_train.sh configs/demo/tiny.py 2 [--seed 3] | tee log\n'
        'make train MODEL=b TRAIN_ARGS=\'--seed 2 --work_dir x\'  # the make target runs tools/train.py\n'
        '```\nThen `tools/train.py CONFIG --work-dir DIR` or `python tools/train.py c --help`.\n',
        '```bash\npython tools/train.py configs/demo/tiny.py --workdir w\n'
        'bash tools/dist_train.sh c 2 --seed 1 --not-train\npython tools/tset.py c\n```\n'
        'Or `make train TRAIN_ARGS=\'--sed 2\'`, `make trian`, `make train MODLE=x`.\n',
        ['python tools/train.py configs/demo/tiny.py --workdir w: --workdir is not an option of tools/train.py',
         'bash tools/dist_train.sh c 2 --seed 1 --not-train: --not-train is not an option of tools/dist_train.sh',
         'python tools/tset.py c: tools/tset.py does not exist',
         "make train TRAIN_ARGS='--sed 2': --sed (in TRAIN_ARGS) is not an option of tools/train.py",
         'make trian: make target trian does not exist',
         'make train MODLE=x: make variable MODLE is not read by the Makefile']),
    'a renamed config': (
        missing_paths, 'docs/a.md',
        '`configs/demo/tiny.py`, configs/demo/*.py, `configs/demo/<name>.py`, `configs/{demo,x}/tiny.py`,\n'
        'docs/a.md#anchor, `models/head.py`, `models/head.HeadClass`, tools/.../train.py, '
        'https://example.org/configs/none.py\n',
        '`configs/demo/tiny_renamed.py` and models/heads.py and tests/x/\n',
        ['configs/demo/tiny_renamed.py', 'models/heads.py', 'tests/x/']),
    'a path outside the repository': (
        outside_paths, 'docs/sub/a.md',
        '[up](../../README.md), [same](../a.md), [label ../a.md](../a.md), ~/.cache/x, `$CMT_AQR_HOME/venv`, '
        '`<root>/samples/x.bin`, 1/16, https://example.org/a/b, `--work-dir /shared/work_dirs/run`\n',
        '[out](../../../x.md) `../shared/gpu-machine/prepare.sh` (`shared/seeds/`) and /work/main/x\n',
        ['../../../x.md', '../shared/gpu-machine/prepare.sh', 'shared/seeds/', '/work/main/x']),
}


@pytest.mark.parametrize('case', sorted(SELF_TEST_PAGES))
def test_each_check_passes_a_sound_page_and_finds_what_is_wrong(tmp_path, case):
    check, page, sound, broken, found = SELF_TEST_PAGES[case]
    _fake_repo(tmp_path)
    (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / page).write_text(sound)
    assert check(page, str(tmp_path)) == []
    (tmp_path / page).write_text(broken)
    assert check(page, str(tmp_path)) == found
