"""The import graph of the package runs downwards only: no cycles, even for typing."""

from __future__ import annotations

import ast
import re
import sys
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
    facades = {"streamkit", "streamkit.spark", "streamkit.jobs", "streamkit.clients"}
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


def _third_party(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports, outside streamkit."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_clients_are_a_surface_over_the_pure_layer() -> None:
    """The blocking and asyncio clients, and the pure modules they share with the Trio
    side, call neither trio nor coredis nor the Trio implementation: one definition of
    each step (not a second copy that could drift), and no Trio loop needed."""
    shared = [
        "streamkit._produce",
        "streamkit._retrying",
        "streamkit._refusals",
        "streamkit._redispy",
        "streamkit.jobs._plan",
        "streamkit.jobs._replies",
        "streamkit.jobs._workflow",
    ]
    clients = [module_name(p) for p in (PACKAGE / "clients").glob("*.py")]
    trio_side = {
        "streamkit._app",
        "streamkit._streams",
        "streamkit._idempotent",
        "streamkit.jobs._queue",
        "streamkit.jobs._handle",
        "streamkit.jobs._serve",
    }
    for name in [*shared, *clients]:
        path = PACKAGE.parent / Path(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        assert not {"trio", "coredis", "anyio"} & _third_party(path), name
        reached = imports_of(path)
        wrong = {m for m in reached if m in trio_side or m.startswith("streamkit._redis.")}
        wrong |= {m for m in reached if m == "streamkit._redis"}
        assert not wrong, (name, sorted(wrong))
    # And the Trio side does call them.
    for trio_module, pure in [
        ("streamkit._streams", "streamkit._produce"),
        ("streamkit._idempotent", "streamkit._produce"),
        ("streamkit.jobs._queue", "streamkit.jobs._plan"),
        ("streamkit.jobs._queue", "streamkit.jobs._replies"),
        ("streamkit._redis._retries", "streamkit._retrying"),
        ("streamkit._redis._translate", "streamkit._refusals"),
    ]:
        path = (PACKAGE.parent / Path(*trio_module.split("."))).with_suffix(".py")
        assert pure in imports_of(path), (trio_module, pure)


def test_only_the_redis_layers_name_a_client_librarys_exceptions() -> None:
    """coredis's exceptions are translated in streamkit._redis, redis-py's in
    streamkit._redispy (which also tells a script the server lacked): no other module
    names one."""
    layers = ("streamkit._redis", "streamkit._redispy")
    naming = re.compile(
        r"\b(?:coredis|redis)\.exceptions\b|from (?:coredis|redis)[\w.]* import [^\n]*Error"
    )
    found = [
        module_name(path)
        for path in PACKAGE.rglob("*.py")
        if not module_name(path).startswith(layers) and naming.search(path.read_text())
    ]
    assert found == []


def test_the_script_loader_needs_only_the_standard_library() -> None:
    """Every driver, the Spark executors' too, imports it: no trio, no Redis client."""
    tree = ast.parse((PACKAGE / "_lua" / "__init__.py").read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported <= set(sys.stdlib_module_names)
