"""What a page of README.md / docs/ refers to: its command lines, the flags they show, the repository paths it names.

Read without running anything: a tool's options are the ``add_argument('--flag', ...)`` strings of its source
(``ast``), with the functions it uses from the repository's own modules followed (``tools/cli/``, ``projects/``); a
shell script's are those of the Python tool it passes ``"$@"`` on to (``tools/dist_train.sh`` -> ``tools/train.py``);
``make TARGET VAR=...`` is read from the Makefile's targets and variables, a variable a recipe passes to a tool
(``DEMO_ARGS``) holding that tool's flags. The checks return what is wrong, as lines for an assertion message:

* :func:`command_problems`: a script that does not exist, a flag its parser does not accept, an unknown make
  target or variable;
* :func:`missing_paths`: a path under ``configs/``, ``tools/``, ``projects/``, ``docs/`` or ``tests/``, or under a
  subpackage of the plugin (``models/aqr/...``), that matches no file (``*``, ``<placeholder>``, ``{a,b}`` and
  ``...`` match anything; ``module.name`` names a module's attribute);
* :func:`outside_paths`: a path out of the repository: ``../`` above its root, ``shared/``, an absolute path.
"""
import ast
import fnmatch
import functools
import glob
import os
import re
import shlex
from typing import Dict, Iterator, List, Optional, Pattern, Set, Tuple

FENCE = re.compile(r'^```.*?^```', re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r'`([^`]+)`')
LINK_TARGET = re.compile(r'(!?\[[^\]]*\])\(([^)\s]+)\)')
#: a repository script, run by python / bash or named alone, then the rest of its command
SCRIPT = re.compile(r'(?<![\w./$-])(tools/[\w/.-]+\.(?:py|sh))\b(.*)')
MAKE = re.compile(r'(?<![\w./-])make\s+(.*)')
FLAG = re.compile(r'^--[a-z0-9][\w-]*$')
SEPARATORS = re.compile(r'\s(?:&&|\|\||;|\||>|2>|<<)\s')
COMMENT = re.compile(r'\s#(?:\s|$)')
#: the folders whose paths a page names as repository paths
REPO_FOLDERS = ('configs', 'tools', 'projects', 'docs', 'tests')
#: the plugin's package, whose subpackages a page names without it (``models/aqr/routing_targets.py``)
PLUGIN = os.path.join('projects', 'mmdet3d_plugin')
PATH_CHARS = r'/[\w./*<>{},-]*'
PARENT_PATH = re.compile(r'(?<![\w.])\.\./[\w./-]*')
SHARED_PATH = re.compile(r'(?<![\w./~$-])shared/[\w./-]*')
ABSOLUTE_PATH = re.compile(r'(?<![\w.~$}/:>-])/[\w.-]+(?:/[\w.*<>-]*)+')
#: absolute paths a page may show: a user's own folder in an example (train_test.md's several machines share their
#: work dir on a file system every machine mounts, written /shared/...)
EXAMPLE_ABSOLUTE_PATHS = ('/shared/work_dirs/', )


def page_text(page: str, root: str) -> str:
    """The text of ``page``, a path relative to ``root``."""
    with open(os.path.join(root, page), encoding='utf-8') as f:
        return f.read()


def code_lines(text: str) -> List[str]:
    """The code of a page, one command per item: each line of its fenced blocks (lines ending in ``\\`` joined with
    the next) and each inline code span outside them (a span may wrap lines)."""
    lines = []
    for block in FENCE.findall(text):
        body = re.sub(r'\\\n\s*', ' ', block.split('\n', 1)[1].rsplit('```', 1)[0])
        lines += [line.strip() for line in body.splitlines() if line.strip()]
    lines += [' '.join(span.split()) for span in INLINE_CODE.findall(FENCE.sub('', text))]
    return lines


def _segments(line: str) -> List[str]:
    """``line`` without its comment (`` # ...``), cut at shell separators (``&&``, ``||``, ``;``, ``|``, ``>``)."""
    command = COMMENT.split(f' {line} ', 1)[0]
    return [segment for segment in SEPARATORS.split(f'{command} ') if segment.strip()]


def _flags(words: str) -> List[str]:
    """The ``--flags`` among ``words`` (brackets, quotes and ``=value`` stripped)."""
    flags = []
    for word in words.split():
        flag = word.strip('[](),;\'"').split('=', 1)[0]
        if FLAG.match(flag):
            flags.append(flag)
    return flags


# ---------------------------------------------------------------- a tool's options, read from its source
def _module_path(name: str, root: str, package: str = '', level: int = 0) -> Optional[str]:
    """The file of module ``name`` in the repository (``level`` > 0: imported relatively from ``package``)."""
    if level:
        parts = package.split('.')
        name = '.'.join(parts[:len(parts) - level + 1] + ([name] if name else []))
    base = os.path.join(root, *name.split('.'))
    for path in (base + '.py', os.path.join(base, '__init__.py')):
        if os.path.isfile(path):
            return path
    return None


@functools.lru_cache(maxsize=None)
def _module(path: str, root: str) -> Tuple[ast.Module, Dict[str, ast.AST], Dict[str, Tuple[str, str]]]:
    """A module's tree, its functions and classes by name, and its imports of repository modules: local name ->
    (file, name in it; '' where the name is the module itself)."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    package = os.path.dirname(os.path.relpath(path, root)).replace(os.sep, '.')
    definitions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    imports = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _module_path(node.module or '', root, package, node.level)
            for alias in node.names:
                full = f'{node.module}.{alias.name}' if node.module else alias.name
                submodule = _module_path(full, root, package, node.level)
                if submodule is not None:
                    imports[alias.asname or alias.name] = (submodule, '')
                elif source is not None:
                    imports[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                source = _module_path(alias.name, root)
                if source is not None and alias.asname:
                    imports[alias.asname] = (source, '')
    return tree, definitions, imports


def parser_flags(path: str, root: str, name: str = '', seen: Optional[Set[Tuple[str, str]]] = None) -> Set[str]:
    """The ``--flags`` that ``add_argument`` calls in ``path`` (the whole file, or its function / class ``name``)
    and in the repository functions it refers to define."""
    seen = set() if seen is None else seen
    if (path, name) in seen:
        return set()
    seen.add((path, name))
    tree, definitions, imports = _module(path, root)
    if name and name not in definitions:
        return set()
    flags = {'--help'}
    for node in ast.walk(definitions[name] if name else tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == 'add_argument':
            flags |= {arg.value for arg in node.args
                      if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith('--')}
        elif isinstance(node, ast.Name) and node.id in definitions and node.id != name:
            flags |= parser_flags(path, root, node.id, seen)
        elif isinstance(node, ast.Name) and node.id in imports and imports[node.id][1]:
            flags |= parser_flags(imports[node.id][0], root, imports[node.id][1], seen)
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imports
              and not imports[node.value.id][1]):
            flags |= parser_flags(imports[node.value.id][0], root, node.attr, seen)
    return flags


def shell_targets(path: str, root: str) -> List[str]:
    """The repository Python tools a shell script passes its arguments on to (``"$@"``), as repository paths."""
    targets = []
    for line in page_text(os.path.relpath(path, root), root).splitlines():
        if '"$@"' in line and not line.lstrip().startswith('#'):
            for script in re.findall(r'([\w.-]+\.py)\b', line):
                candidate = os.path.join(os.path.dirname(os.path.relpath(path, root)), script)
                if os.path.isfile(os.path.join(root, candidate)):
                    targets.append(candidate)
    return targets


def accepted_flags(script: str, root: str) -> Optional[Set[str]]:
    """The flags ``script`` (a repository path) accepts; None where they cannot be read (a shell script that passes
    its arguments to no repository tool, e.g. to pytest)."""
    path = os.path.join(root, script)
    if script.endswith('.py'):
        return parser_flags(path, root)
    targets = shell_targets(path, root)
    return set().union(*(parser_flags(os.path.join(root, target), root) for target in targets)) if targets else None


# ---------------------------------------------------------------- make
def makefile(root: str) -> Tuple[Set[str], Set[str], Dict[str, str]]:
    """The Makefile's targets, the variables it reads, and per variable the tool a recipe passes it to."""
    text = page_text('Makefile', root)
    targets = set(re.findall(r'^([\w-]+):', text, re.MULTILINE))
    variables = set(re.findall(r'\$\((\w+)\)', text)) | set(re.findall(r'^(\w+)\s*\?=', text, re.MULTILINE))
    passed = {}
    for line in text.splitlines():
        script = re.search(r'(tools/[\w/.-]+\.py)', line)
        if line.startswith('\t') and script:
            passed.update({variable: script.group(1) for variable in re.findall(r'\$\((\w+)\)', line[script.end():])})
    return targets, variables, passed


def _make_problems(arguments: str, root: str) -> Iterator[str]:
    """What is wrong with ``make <arguments>``: an unknown target or variable, a flag the variable's tool refuses."""
    targets, variables, passed = makefile(root)
    try:
        words = shlex.split(arguments)
    except ValueError:
        words = arguments.split()
    for word in (word.strip('[]') for word in words):
        if re.fullmatch(r'\w+=.*', word):
            variable, value = word.split('=', 1)
            if variable not in variables:
                yield f'make variable {variable} is not read by the Makefile'
            elif variable in passed and accepted_flags(passed[variable], root) is not None:
                unknown = sorted(set(_flags(value)) - accepted_flags(passed[variable], root))
                yield from (f'{flag} (in {variable}) is not an option of {passed[variable]}' for flag in unknown)
        elif re.fullmatch(r'[\w-]+', word):
            if word not in targets:
                yield f'make target {word} does not exist'
        else:
            return


def command_problems(page: str, root: str) -> List[str]:
    """What is wrong with the command lines of ``page``: ``'<command>: <problem>'`` per problem."""
    return [f'{segment.strip()}: {problem}' for line in code_lines(page_text(page, root))
            for segment in _segments(line) for problem in _segment_problems(segment, root)]


def _segment_problems(segment: str, root: str) -> Iterator[str]:
    """What is wrong with one command: its script (``tools/...``) and its flags, or its ``make`` arguments."""
    script = SCRIPT.search(segment)
    if script:
        name, rest = script.groups()
        if not os.path.isfile(os.path.join(root, name)):
            yield f'{name} does not exist'
            return
        accepted = accepted_flags(name, root)
        if accepted is not None:
            yield from (f'{flag} is not an option of {name}' for flag in _flags(rest) if flag not in accepted)
        return
    make = MAKE.search(segment)
    if make:
        yield from _make_problems(make.group(1), root)


# ---------------------------------------------------------------- paths
def _as_glob(path: str) -> str:
    """A page's path as a recursive glob: ``<placeholder>`` and ``{a,b}`` match a name, ``...`` any folders."""
    return re.sub(r'<[^>]*>?|\{[^}]*\}?', '*', path.rstrip('.,:;').replace('...', '**'))


def _path_pattern(folders: List[str]) -> Pattern:
    """Paths that start with one of ``folders``."""
    return re.compile(r'(?<![\w./~$-])((?:' + '|'.join(folders) + ')' + PATH_CHARS + ')')


def _exists(path: str, base: str) -> bool:
    """Whether ``path`` (a page's path, relative to the folder ``base``) matches a file or folder, or names an
    attribute of a module (``module.name``)."""
    pattern = os.path.join(base, _as_glob(path))
    if glob.glob(pattern, recursive=True):
        return True
    module = re.fullmatch(r'(.+)\.\w+', pattern)
    return module is not None and bool(glob.glob(module.group(1) + '.py', recursive=True))


def missing_paths(page: str, root: str) -> List[str]:
    """The repository paths ``page`` names (under :data:`REPO_FOLDERS` or a subpackage of :data:`PLUGIN`) that
    match nothing."""
    text = page_text(page, root)
    plugin = os.path.join(root, PLUGIN)
    subpackages = sorted(name for name in os.listdir(plugin) if os.path.isdir(os.path.join(plugin, name))
                         and not name.startswith('_')) if os.path.isdir(plugin) else []
    named = [(path, root) for path in _path_pattern(list(REPO_FOLDERS)).findall(text)]
    named += [(path, plugin) for path in _path_pattern(subpackages).findall(text)] if subpackages else []
    return sorted({path for path, base in named if not _exists(path, base)})


def outside_paths(page: str, root: str) -> List[str]:
    """The paths ``page`` names outside the repository: a link or a ``../`` path above its root, ``shared/``, an
    absolute path (but :data:`EXAMPLE_ABSOLUTE_PATHS`)."""
    text = page_text(page, root)
    found = []
    folder = os.path.dirname(os.path.join(root, page))
    for _, target in LINK_TARGET.findall(text):
        resolved = os.path.normpath(os.path.join(folder, target.split('#')[0]))
        if '://' not in target and not resolved.startswith(os.path.normpath(root) + os.sep) and resolved != root:
            found.append(target)
    text = LINK_TARGET.sub('', text)  # its label too: a label's path is the page's, checked with its target
    found += PARENT_PATH.findall(text) + SHARED_PATH.findall(text)
    found += [path for path in ABSOLUTE_PATH.findall(text)
              if not any(fnmatch.fnmatch(path, prefix + '*') for prefix in EXAMPLE_ABSOLUTE_PATHS)]
    return found
