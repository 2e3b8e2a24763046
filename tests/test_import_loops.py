"""No import loop hides behind a function-local import.

A function-level ``from causalab.x import y`` that the imported module answers by importing the
caller back (at its top or in a function of its own) is a loop that works only by the order
functions run; the shared piece belongs in a lower module both import. Imports of laziness
(torch, transformers, mlflow's plots) are fine: nothing imports back. ``from pkg import mod``
counts as an import of ``pkg.mod``, not of the package's ``__init__`` (which runs first for
every module of the package, so it closes no loop of its own).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "causalab"


def _module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _targets(node: ast.AST, modules: dict) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        found = {f"{node.module}.{alias.name}" for alias in node.names}
        found = {name for name in found if name in modules}
        named_only = len(found) == len(node.names)
        return found if named_only else found | ({node.module} & set(modules))
    return set()


def _graphs() -> tuple[dict, dict]:
    """(module -> modules imported at module level, module -> modules imported in a function)."""
    modules = _module_names()
    top, local = defaultdict(set), defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inner = {id(node) for function in ast.walk(tree)
                 if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for node in ast.walk(function)}
        for node in ast.walk(tree):
            graph = local if id(node) in inner else top
            graph[name] |= _targets(node, modules) - {name}
    return top, local


def _reaches(start: str, goal: str, graph: dict) -> bool:
    seen, stack = {start}, [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return False


def test_no_function_local_import_closes_an_import_loop():
    top, local = _graphs()
    both = defaultdict(set, {name: top[name] | local[name] for name in set(top) | set(local)})
    assert sum(len(targets) for targets in local.values()) > 10, "found no local imports"
    loops = sorted(f"{name} imports {target} in a function, and {target} imports {name} back"
                   for name, targets in local.items() for target in targets
                   if _reaches(target, name, both))
    assert not loops, loops


def _cycle(graph: dict) -> list[str] | None:
    """One cycle of ``graph`` as the path round it, else None (depth-first, three colours)."""
    state: dict[str, int] = {}
    trail: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        trail.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return trail[trail.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        trail.pop()
        return None

    return next((found for node in sorted(graph) if node not in state
                 for found in [walk(node)] if found), None)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_two_rooms_import_each_other_round_a_loop():
    """Rooms are the folders of ``causalab/`` (a module at its top is a room of its own): data
    and calls go one way between them, whether imported at the top or in a function."""
    def room(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 2 or (PACKAGE / parts[-1]).is_dir() else module

    top, local = _graphs()
    rooms: dict[str, set[str]] = defaultdict(set)
    for graph in (top, local):
        for module, imported in graph.items():
            rooms[room(module)] |= {room(other) for other in imported} - {room(module)}
    assert {"document", "compile", "engine", "tracking", "scores", "plots"} <= set(rooms)
    found = _cycle(rooms)
    assert found is None, " -> ".join(found)
