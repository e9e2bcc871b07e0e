"""The public namespace: explicit re-exports, each documented."""

from __future__ import annotations

import inspect
from pathlib import Path

import streamkit

DOCS = Path(__file__).resolve().parent.parent / "docs"


def public_names() -> list[str]:
    return [
        name
        for name, value in vars(streamkit).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    ]


def test_public_names_come_from_streamkit_modules() -> None:
    for name in public_names():
        value = getattr(streamkit, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue  # type aliases keep the module of what they alias
        module = value.__module__
        assert module.startswith("streamkit"), (name, module)


def test_every_public_name_is_documented() -> None:
    text = "\n".join(page.read_text() for page in DOCS.glob("*.md"))
    missing = [name for name in public_names() if f"streamkit.{name}" not in text]
    assert not missing, f"not in any docs page: {missing}"
