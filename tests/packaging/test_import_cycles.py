"""No two modules of our packages import each other, directly or around a loop.

Every import counts, the lazy ones inside a function too (a late import hides a cycle, it does not
remove it); only `if TYPE_CHECKING:` blocks are left out, since they never run. A module is a node,
`from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "vgpuctl": ROOT / "operator",
    "vgpu_operator": ROOT / "operator",
    "vgpu_formats": ROOT / "operator",
    "vgpu_deviceplugin": ROOT / "deviceplugin",
}

# Known cycles, each the exact set of modules of one strongly connected component. Empty today:
# an entry here is a cycle being removed by the runtime package refactor, and goes once it is.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


def modules(packages: Mapping[str, Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, base in packages.items():
        for path in sorted((base / package).rglob("*.py")):
            if "_pb2" in path.name:  # generated stubs, not in git
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(child)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
            continue
        if node.level:
            base = package[:len(package) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            if f"{target}.{alias.name}" in known:
                out.add(f"{target}.{alias.name}")
            elif target in known:
                out.add(target)
    out.discard(name)  # a package naming its own attributes (`from . import x` in __init__)
    return out


def import_graph(packages: Mapping[str, Path]) -> dict[str, set[str]]:
    known = modules(packages)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(frozenset(component))
    return found


def _describe(component: frozenset[str], graph: Mapping[str, set[str]]) -> str:
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & component))}" for m in sorted(component))


def test_no_import_cycles_outside_the_known_ones() -> None:
    graph = import_graph(PACKAGES)
    assert "vgpuctl.main" in graph and "vgpu_deviceplugin" in graph, sorted(graph)[:5]
    new = [c for c in cycles(graph) if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, "import cycles: " + " | ".join(_describe(c, graph) for c in new) + (
        " (move what both sides need into a third module, as vgpuctl.errors is for main/commands)")


def test_every_known_cycle_still_exists() -> None:
    found = cycles(import_graph(PACKAGES))
    gone = [sorted(known) for known in KNOWN_CYCLES if not any(c & known for c in found)]
    assert not gone, f"these cycles are gone, remove them from KNOWN_CYCLES: {gone}"


def test_the_check_sees_a_lazy_import_cycle(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text("def run():\n    from pkg.commands import go\n    return go()\n")
    (package / "commands.py").write_text("from pkg.main import run\n")
    (package / "other.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                      "    from pkg import main\nfrom . import commands\n")
    graph = import_graph({"pkg": tmp_path})
    assert graph["pkg.other"] == {"pkg.commands"}
    assert cycles(graph) == [frozenset({"pkg.main", "pkg.commands"})]
