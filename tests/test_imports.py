"""The package's imports, drawn from its source: no circles, no arrow up a floor.

Every import counts, lazy ones inside functions and TYPE_CHECKING ones too:
a circle that only closes at run time still ties two rooms into one.
The floors are ARCHITECTURE.md's layers (its code map), bottom first; a module may import its own
floor and the ones below it, never one above.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "abicache"

#: bottom first; each name is a top-level module or a subpackage of abicache
FLOORS: list[set[str]] = [
    {"errors", "values", "settings", "native", "console", "hip"},
    {"env"},
    {"audit"},
    {"store"},
    {"remote"},
    {"shipping"},
    {"core"},
    {"hits"},
    {"engine"},
    {"cc", "cuda", "torch", "triton", "tvm_ffi", "dropin", "frontends", "launcher"},
    {"cli"},
    {"__init__", "__main__"},
]


#: what a module may take from abicache/__init__.py, which sets it before any module is imported
#: (the version: a module of its own cost a torch extension's hit ~0.1 ms, issue 49)
ROOT_VALUES = {"__version__"}


def _module_name(path: Path) -> tuple[str, str]:
    """(dotted module name, the package its relative imports start from)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").is_file() or (PACKAGE.parent / rel / "__init__.py").is_file()


def _imported(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if module == "abicache" and all(a.name in ROOT_VALUES for a in node.names):
        return []  # a value of the package's top, imported before any module of it: no arrow
    # `from . import config` imports the module abicache.settings.config, not the package's __init__
    named = [f"{module}.{a.name}" for a in node.names if _exists(f"{module}.{a.name}")]
    return named if named and len(named) == len(node.names) else [module, *named]


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        name, package = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, package):
                if target.split(".")[0] == "abicache" and target != name and _exists(target):
                    edges[name].add(target)
    return edges


def _room(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _floor(room: str) -> int:
    for i, floor in enumerate(FLOORS):
        if room in floor:
            return i
    raise AssertionError(f"abicache.{room} is on no floor of tests/test_imports.py: place it in FLOORS")


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_source() -> None:
    edges = _graph()
    assert "abicache.core.cache" in edges["abicache.cc"]
    assert "abicache.engine.units" in edges["abicache.frontends.cc_plans"]  # a lazy import, inside a function, counts
    assert "abicache.store.manifest" in edges["abicache.core.getting"]


def test_no_import_circles() -> None:
    # a module's own package is imported before it whatever it says: no arrow of its own
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in _graph().items()}
    assert _cycles(edges) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_arrow_runs_up_a_floor() -> None:
    upward = sorted(f"{m} -> {t}" for m, ts in _graph().items() for t in ts
                    if _floor(_room(t)) > _floor(_room(m)))
    assert upward == []


def test_every_room_is_on_a_floor() -> None:
    rooms = {_room(_module_name(p)[0]) for p in PACKAGE.rglob("*.py")}
    for room in rooms:
        _floor(room)


@pytest.mark.parametrize("name", ["build", "dist", "out"])
def test_no_source_folder_is_named_like_output(name: str) -> None:
    assert not (PACKAGE / name).exists()
