"""Every relative link in README.md and docs/*.md points at an existing file (and heading, for ``#anchor`` links)."""
import os
import re
from typing import List

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
FENCE = re.compile(r'^```.*?^```', re.MULTILINE | re.DOTALL)
EXTERNAL = ('http://', 'https://', 'mailto:')


def markdown_pages(root: str = REPO_ROOT) -> List[str]:
    """README.md and every ``docs/*.md``, as paths relative to ``root``."""
    docs = sorted(name for name in os.listdir(os.path.join(root, 'docs')) if name.endswith('.md'))
    return ['README.md'] + [os.path.join('docs', name) for name in docs]


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


@pytest.mark.parametrize('page', markdown_pages())
def test_relative_links_point_at_existing_files(page):
    assert broken_links(page) == [], f'{page} has broken links'


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 'a.md').write_text('# Real heading\n\n```\n[in code](nowhere.md)\n```\n')
    (tmp_path / 'README.md').write_text('[ok](docs/a.md#real-heading) [file](docs/missing.md) '
                                        '[anchor](docs/a.md#nope) [web](https://example.org/x)\n')
    root = str(tmp_path)
    assert markdown_pages(root) == ['README.md', os.path.join('docs', 'a.md')]
    assert broken_links('README.md', root) == ['docs/missing.md (no such file)', 'docs/a.md#nope (no heading #nope)']
    assert broken_links(os.path.join('docs', 'a.md'), root) == []
