"""The plugin's packages import only downwards, tools import no other tool, and argparse stays in ``tools/``.

Read from the source (the AST of every import, those inside functions too), so nothing is imported.
``python tests/test_package_layers.py`` prints the package graph and every violation.
"""
import ast
import os
import os.path as osp
import sys
from typing import Dict, Iterator, List, Set, Tuple

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PLUGIN = 'projects.mmdet3d_plugin'
PLUGIN_DIR = osp.join(REPO_ROOT, 'projects', 'mmdet3d_plugin')
TOOLS_DIR = osp.join(REPO_ROOT, 'tools')
#: The plugin's packages from the bottom up: a package may import those of a lower layer and itself only.
#: Packages of one layer (``diagnostics``, ``experiments``) do not import each other. ``config_upgrade`` serves
#: whoever reads a config (``models``, ``mmcv_custom.launch``); ``core`` draws boxes with ``datasets``' geometry;
#: the detector (``models``) logs through ``mmcv_custom``'s device log.
LAYERS = (('utils', ), ('attention', ), ('config_upgrade', ), ('datasets', ), ('core', ), ('mmcv_custom', ),
          ('models', ), ('apis', ), ('diagnostics', 'experiments'))
RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}
MAX_TOOL_LINES = 120


def python_files(folder: str, recursive: bool = True) -> Iterator[str]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__') if recursive else []
        yield from (osp.join(root, name) for name in sorted(files) if name.endswith('.py'))


def module_name(path: str) -> str:
    parts = osp.relpath(path, REPO_ROOT)[:-len('.py')].split(os.sep)
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def imported_modules(path: str) -> Iterator[Tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``path`` (``from a import b`` gives ``a.b`` and ``a``)."""
    package = module_name(path) if path.endswith('__init__.py') else module_name(path).rpartition('.')[0]
    with open(path, encoding='utf-8') as file:
        tree = ast.parse(file.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')[:len(package.split('.')) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            yield node.lineno, base
            yield from ((node.lineno, f'{base}.{alias.name}') for alias in node.names if alias.name != '*')


def plugin_package(module: str) -> str:
    """The plugin package of ``module`` (``projects.mmdet3d_plugin.models.x`` -> ``models``); '' outside it."""
    parts = module.split('.')
    return parts[2] if module.startswith(PLUGIN + '.') and len(parts) > 2 else ''


def package_graph() -> Dict[Tuple[str, str], List[str]]:
    """``(importer, imported)`` package pair -> ``path:line`` of each import between two packages."""
    edges: Dict[Tuple[str, str], List[str]] = {}
    for path in python_files(PLUGIN_DIR):
        source = plugin_package(module_name(path))
        if not source:
            continue  # the plugin's own __init__ imports its packages to register them
        for line, module in imported_modules(path):
            target = plugin_package(module)
            site = f'{osp.relpath(path, REPO_ROOT)}:{line}'
            if target and target != source and site not in edges.get((source, target), ()):
                edges.setdefault((source, target), []).append(site)
    return edges


def layer_violations() -> List[str]:
    """Every import of a package from a package of the same or a lower layer (upward or sideways)."""
    found = []
    for (source, target), sites in sorted(package_graph().items()):
        if source not in RANK or target not in RANK:
            found.append(f'{source} -> {target}: a package missing from LAYERS ({", ".join(sites[:3])})')
        elif RANK[target] >= RANK[source]:
            found.append(f'{source} -> {target} goes up or sideways: {", ".join(sites)}')
    return found


def package_cycles() -> List[List[str]]:
    """Import cycles between the plugin's packages (each as the packages along it)."""
    graph: Dict[str, Set[str]] = {}
    for source, target in package_graph():
        graph.setdefault(source, set()).add(target)
    cycles, path, done = [], [], set()

    def visit(node: str) -> None:
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        path.append(node)
        for target in sorted(graph.get(node, ())):
            visit(target)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)
    return cycles


def tool_scripts() -> List[str]:
    return list(python_files(TOOLS_DIR, recursive=False))


def tool_violations() -> List[str]:
    """A ``tools/*.py`` importing another ``tools/*.py``, or longer than :data:`MAX_TOOL_LINES` lines."""
    scripts = {module_name(path) for path in tool_scripts()}
    found = []
    for path in tool_scripts():
        with open(path, encoding='utf-8') as file:
            lines = len(file.read().splitlines())
        if lines > MAX_TOOL_LINES:
            found.append(f'{osp.relpath(path, REPO_ROOT)} has {lines} lines (at most {MAX_TOOL_LINES})')
        for line, module in imported_modules(path):
            if module in scripts:
                found.append(f'{osp.relpath(path, REPO_ROOT)}:{line} imports the tool {module}')
    return found


def argparse_users() -> List[str]:
    """Modules under ``projects/`` that import argparse (the library takes values; ``tools/cli`` parses)."""
    found = []
    for path in python_files(osp.join(REPO_ROOT, 'projects')):
        relative = osp.relpath(path, REPO_ROOT).replace(os.sep, '/')
        found += [f'{relative}:{line}' for line, module in imported_modules(path) if module.split('.')[0] == 'argparse']
    return found


def test_every_plugin_package_has_a_layer():
    packages = {name for name in os.listdir(PLUGIN_DIR) if osp.isfile(osp.join(PLUGIN_DIR, name, '__init__.py'))}
    assert packages == set(RANK), f'packages {sorted(packages ^ set(RANK))}: add them to LAYERS or remove them'


def test_packages_import_only_lower_layers():
    assert not layer_violations(), '\n'.join(layer_violations())


def test_no_import_cycle_between_packages():
    assert not package_cycles(), package_cycles()


def test_no_tool_imports_another_and_every_tool_is_short():
    assert tool_scripts(), 'no tools/*.py found'
    assert not tool_violations(), '\n'.join(tool_violations())


def test_no_argparse_in_the_library():
    assert not argparse_users(), 'argparse belongs in tools/cli/: ' + ', '.join(argparse_users())


if __name__ == '__main__':
    for (source, target), sites in sorted(package_graph().items(), key=lambda item: (RANK.get(item[0][0], -1),
                                                                                     item[0])):
        print(f'{source:>12} -> {target:<12} {len(sites):3d} imports')
    problems = layer_violations() + [' -> '.join(cycle) for cycle in package_cycles()] + tool_violations() + \
        argparse_users()
    print('\n'.join(problems) or 'no upward import, no cycle, no tool importing a tool, no tool over '
          f'{MAX_TOOL_LINES} lines, no argparse in projects/')
    sys.exit(1 if problems else 0)
