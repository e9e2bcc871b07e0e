"""The public namespaces, ``streamkit`` and ``streamkit.jobs``: explicit re-exports,
each documented."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import streamkit
import streamkit.clients
import streamkit.jobs
import streamkit.metrics

if TYPE_CHECKING:
    import types

DOCS = Path(__file__).resolve().parent.parent / "docs"
NAMESPACES = [streamkit, streamkit.jobs, streamkit.metrics, streamkit.clients]


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


@pytest.mark.parametrize(
    "module", [streamkit.jobs, streamkit.metrics, streamkit.clients], ids=lambda m: m.__name__
)
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
