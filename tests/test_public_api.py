"""The public namespace: explicit re-exports, each documented."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import streamkit

DOCS = Path(__file__).resolve().parent.parent / "docs"


def public_names() -> list[str]:
    return [
        name
        for name, value in vars(streamkit).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    ]


def test_public_names_report_streamkit_as_their_module() -> None:
    for name in public_names():
        value = getattr(streamkit, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue  # type aliases keep the module of what they alias
        assert value.__module__ == "streamkit", (name, value.__module__)
    assert repr(streamkit.LockLost) == "<class 'streamkit.LockLost'>"


def test_every_public_name_is_documented() -> None:
    text = "\n".join(page.read_text() for page in DOCS.glob("*.md"))
    documented = set(re.findall(r"streamkit\.(\w+)\b", text))
    missing = [name for name in public_names() if name not in documented]
    assert not missing, f"not in any docs page: {missing}"


def test_docs_and_examples_name_only_public_modules() -> None:
    """Composing the pieces needs nothing private: no page or example names one."""
    root = DOCS.parent
    files = [*DOCS.glob("*.md"), *root.glob("examples/**/*.py"), root / "README.md"]
    offenders = [
        f"{path.relative_to(root)}: {match}"
        for path in files
        for match in re.findall(r"streamkit\._\w+", path.read_text())
    ]
    assert not offenders, offenders
