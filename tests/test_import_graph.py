"""The package's modules import each other without a circle (every import counts, lazy ones too, except
under ``if TYPE_CHECKING``), so that each layer can be read, tested and replaced on its own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "repro"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports (a name resolves to the longest known module prefix)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name not in (here, "repro"):
                found.add(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a list of modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in sorted(graph):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_import_circle_among_the_package_modules():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: _imports(p, set(files)) for m, p in files.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_circle_and_passes_a_tree():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


# The upper floors: what writes and draws the papers' experiments, and the command line. The library below
# them (core types, planners, simulator, runtime, launchers, training loop) never imports them.
UPPER = ("repro.studies", "repro.figures", "repro.cli.main", "repro.cli.compare", "repro.cli.grid", "repro.__main__")


def _upper(module: str) -> bool:
    return any(module == u or module.startswith(u + ".") for u in UPPER)


def test_the_library_never_imports_the_studies_figures_or_cli():
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    upward = sorted(f"{m} -> {t}" for m, p in files.items() if not _upper(m) and m != "repro"
                    for t in _imports(p, set(files)) if _upper(t))
    assert not upward, "upward imports: " + ", ".join(upward)


def _part(module: str) -> str:
    """The part of the package a module belongs to: its folder under repro/ (``repro.launch``), or itself for a
    module at the root (``repro.api``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_the_packages_folders_import_each_other_without_a_circle():
    """Read folder by folder (core, costs, launch, runtime, families, api, training, grids, cli, ...), the
    imports form layers: no folder imports one that imports it back, however long the way round."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for m, p in files.items():
        graph.setdefault(_part(m), set()).update(_part(t) for t in _imports(p, set(files)) if _part(t) != _part(m))
    graph.pop("repro", None)  # the package's face: lazy names for users, imported by no layer for itself
    graph = {m: targets - {"repro"} for m, targets in graph.items()}
    cycle = _cycle(graph)
    assert cycle is None, "folders in a circle: " + " -> ".join(cycle)
