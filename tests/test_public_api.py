"""The public namespaces (``streamkit``, ``streamkit.lowlevel`` and the subpackages):
explicit re-exports, each documented, a lean top level, no name in two of them."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import streamkit
import streamkit.clients
import streamkit.jobs
import streamkit.lowlevel
import streamkit.metrics
import streamkit.testing

if TYPE_CHECKING:
    import types

DOCS = Path(__file__).resolve().parent.parent / "docs"
NAMESPACES = [streamkit, streamkit.lowlevel, streamkit.jobs, streamkit.metrics, streamkit.clients]
SUBMODULES = [streamkit.lowlevel, streamkit.jobs, streamkit.metrics, streamkit.clients]
#: The most names ``streamkit`` itself exports: what an app author and a service author
#: use (docs/api.md, "What is where, and why"); the rest is in streamkit.lowlevel.
TOP_LEVEL_AT_MOST = 60


def public_names(module: types.ModuleType = streamkit) -> list[str]:
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    ]


@pytest.mark.parametrize("module", NAMESPACES, ids=lambda m: m.__name__)
def test_public_names_report_their_namespace_as_their_module(module: types.ModuleType) -> None:
    for name in public_names(module):
        value = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue  # type aliases keep the module of what they alias
        assert value.__module__ == module.__name__, (name, value.__module__)
    assert repr(streamkit.LockLost) == "<class 'streamkit.LockLost'>"
    assert repr(streamkit.jobs.JobFailed) == "<class 'streamkit.jobs.JobFailed'>"


@pytest.mark.parametrize("module", SUBMODULES, ids=lambda m: m.__name__)
def test_subpackages_export_exactly_their_all(module: types.ModuleType) -> None:
    assert sorted(public_names(module)) == sorted(module.__all__)


@pytest.mark.parametrize("module", NAMESPACES, ids=lambda m: m.__name__)
def test_every_public_name_is_documented(module: types.ModuleType) -> None:
    text = "\n".join(page.read_text() for page in DOCS.glob("*.md"))
    prefix = re.escape(module.__name__)
    documented = set(re.findall(rf"{prefix}\.(\w+)\b", text))
    missing = [name for name in public_names(module) if name not in documented]
    assert not missing, f"not in any docs page: {missing}"


def test_docs_and_examples_name_only_public_modules() -> None:
    """Composing the pieces needs nothing private: no page or example names one."""
    root = DOCS.parent
    files = [*DOCS.glob("*.md"), *root.glob("examples/**/*.py"), root / "README.md"]
    offenders = [
        f"{path.relative_to(root)}: {match}"
        for path in files
        for match in re.findall(r"streamkit\.(?:\w+\.)?_\w+", path.read_text())
    ]
    assert not offenders, offenders


def test_the_top_level_is_lean() -> None:
    names = public_names(streamkit)
    assert len(names) <= TOP_LEVEL_AT_MOST, (
        f"streamkit exports {len(names)} names, at most {TOP_LEVEL_AT_MOST}: what is not "
        "for app and service authors goes to streamkit.lowlevel"
    )


def test_no_two_public_modules_share_a_name() -> None:
    """``streamkit.Middleware`` and ``streamkit.jobs.Middleware`` were two things: no
    public name (class, alias or function) means one thing here and another there."""
    modules = [*NAMESPACES, streamkit.testing]
    with_spark = importlib.util.find_spec("pyspark") is not None
    if with_spark:
        modules.append(importlib.import_module("streamkit.spark"))
    homes: dict[str, list[str]] = {}
    for module in modules:
        for name in getattr(module, "__all__", None) or public_names(module):
            homes.setdefault(name, []).append(module.__name__)
    shared = {name: where for name, where in homes.items() if len(where) > 1}
    assert not shared, shared


def test_lowlevel_holds_the_helpers_under_the_pieces() -> None:
    top = set(public_names(streamkit))
    low = set(streamkit.lowlevel.__all__)
    assert {"redis_errors", "call_once", "run_blocking", "diff", "assign"} <= low
    assert not top & low, sorted(top & low)
    # What every app and service author needs stays on top.
    assert {"App", "Record", "Stream", "Events", "open_redis", "StreamkitError"} <= top


@pytest.mark.parametrize("name", sorted(streamkit.lowlevel.__all__))
def test_a_name_that_moved_to_lowlevel_resolves_with_a_warning(name: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"streamkit\.{name} is now streamkit\.lowlevel"):
        value = getattr(streamkit, name)
    assert value is getattr(streamkit.lowlevel, name)


def test_the_renamed_job_middleware_resolves_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"streamkit\.jobs\.JobMiddleware"):
        value = streamkit.jobs.Middleware  # type: ignore[attr-defined]
    assert value is streamkit.jobs.JobMiddleware


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        _ = streamkit.no_such_thing  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        _ = streamkit.jobs.no_such_thing  # type: ignore[attr-defined]
