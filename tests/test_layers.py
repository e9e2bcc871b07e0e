"""The import graph of the package runs downwards only: no cycles, even for typing."""

from __future__ import annotations

import ast
from pathlib import Path

import streamkit

PACKAGE = Path(streamkit.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every streamkit module ``path`` imports, TYPE_CHECKING imports included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("streamkit"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if not target.startswith("streamkit"):
                continue
            # `from . import _keys` imports a module; `from ._x import y` imports _x.
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _is_module(candidate) else target)
    return found - {name}


def _is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").exists() or (PACKAGE / relative).is_dir()


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    # The package facades re-export everything below them; they are the top.
    facades = {"streamkit", "streamkit.spark", "streamkit.jobs"}
    return {
        name: {m for m in imports_of(path) if m in modules and m not in facades}
        for name, path in modules.items()
    }


def test_no_import_cycles() -> None:
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_spark_executors_need_neither_trio_nor_coredis() -> None:
    """Spark's Python workers import the wire facts without the async stack."""
    edges = graph()
    reached: set[str] = set()
    pending = ["streamkit.spark._writer", "streamkit.spark._reader", "streamkit.spark._client"]
    while pending:
        current = pending.pop()
        if current not in reached:
            reached.add(current)
            pending.extend(edges[current])
    heavy = {"streamkit._redis", "streamkit._fetcher", "streamkit._streams", "streamkit._events"}
    # Importing any module of the Redis layer runs the layer's __init__ (coredis, trio).
    found = {m for m in reached if m in heavy or m.startswith("streamkit._redis.")}
    assert not found, sorted(found)


def test_settings_and_defaults_sit_at_the_bottom() -> None:
    """The frozen config imports its defaults from streamkit._defaults, not from the
    components it configures: nothing above the pure layer is reached from it."""
    edges = graph()
    assert edges["streamkit._defaults"] == set()
    reached: set[str] = set()
    pending = ["streamkit._settings"]
    while pending:
        current = pending.pop()
        if current not in reached:
            reached.add(current)
            pending.extend(edges[current])
    allowed = {
        "streamkit._settings",
        "streamkit._defaults",
        "streamkit._errors",
        "streamkit._urls",
        "streamkit._validate",
        "streamkit._compression",
    }
    assert reached <= allowed, sorted(reached - allowed)
