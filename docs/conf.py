"""Sphinx configuration for the streamkit documentation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "streamkit"
author = "streamkit developers"
copyright = "2026, streamkit developers"  # noqa: A001 (Sphinx reads this name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinxcontrib.mermaid",
    "cli_reference",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_fence_as_directive = ["mermaid"]
myst_heading_anchors = 3
exclude_patterns = ["_build"]

html_theme = "furo"
html_title = "streamkit"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

nitpicky = False


def _private(base: object) -> bool:
    """Whether a base class is one of streamkit's private helpers (a private name, or
    a module no public name is re-exported from)."""
    name = getattr(base, "__name__", "")
    module = getattr(base, "__module__", "")
    return name.startswith("_") or any(part.startswith("_") for part in module.split("."))


def _public_bases(app: object, name: str, obj: object, options: object, bases: list[Any]) -> None:
    """ "Bases:" names public classes only: a private helper base (the clients' shared
    part, say) gives way to its own bases, and ``object`` goes when another is left."""
    shown: list[Any] = []
    pending = list(bases)
    while pending:
        base = pending.pop(0)
        origin = getattr(base, "__origin__", base)  # Table[V]: Table's
        if _private(origin):
            pending[:0] = [b for b in origin.__bases__ if b is not object]
        elif base not in shown:
            shown.append(base)
    bases[:] = shown or [object]


def setup(app: Any) -> None:
    app.connect("autodoc-process-bases", _public_bases)
