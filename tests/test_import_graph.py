"""The project's import graph has no circles (one meaning per name: tests/test_names.py).

Read from the source with `ast` (nothing is imported): every import between the project's own modules counts,
also those inside functions and under `if TYPE_CHECKING:`, because a circle hidden by a late import is still a
circle to a reader (each of the two modules needs the other to be understood).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kiln", "pretrain", "finetune")


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages (`pkg/__init__.py` is `pkg`)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of `from <level dots><target> import ...` written in `module`."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source (top level, functions, TYPE_CHECKING)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}

    def known(name: str) -> str | None:
        # `import kiln.config.x` or a name inside a module: the longest prefix that is a project module
        parts = name.split(".")
        while parts:
            if ".".join(parts) in modules:
                return ".".join(parts)
            parts.pop()
        return None

    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                targets = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            for target in targets:
                found = known(target)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as paths that return to their start: the strongly connected groups of modules
    (Tarjan), and in each the shortest circle through every one of its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)

    cycles: list[list[str]] = []
    for group in groups:
        members = set(group)
        for start in group:  # the shortest circle through each module of the group, each circle once
            cycle = _shortest_circle(graph, members, start)
            if not any(set(cycle) == set(seen) and len(cycle) == len(seen) for seen in cycles):
                cycles.append(cycle)
    return cycles


def _shortest_circle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """start -> ... -> start, by breadth-first search inside one strongly connected group."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in previous:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    path = [start]
    while True:
        path.append(previous[path[-1]])
        if path[-1] == start:
            break
    return path[::-1]


def test_no_import_circles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_cycle_finder_reports_a_circle():
    """The checker itself: a circle through a late import is found and printed as a path."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    two_circles = {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}
    assert find_cycles(two_circles) == [["a", "b", "a"], ["c", "a", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
