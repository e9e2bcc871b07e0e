"""Public names report their public module, as trio's do (see :func:`fix_module_metadata`);
names that moved still resolve, with a warning (:func:`moved`)."""

from __future__ import annotations

import contextlib
import importlib
import typing
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["fix_module_metadata", "moved"]


def _private(module: str) -> bool:
    """Whether ``module`` is one of streamkit's private modules (``streamkit._x``,
    ``streamkit.jobs._y``)."""
    parts = module.split(".")
    return parts[0] == "streamkit" and any(part.startswith("_") for part in parts[1:])


def fix_module_metadata(module: str, namespace: dict[str, Any]) -> None:
    """Make the public names of ``namespace`` report ``module`` as their module, so that
    tracebacks, reprs and docs show ``streamkit.LockLost``, not ``streamkit._errors``.

    Classes with annotations keep their home module's view of them: their type hints
    are resolved there first."""
    seen: set[int] = set()

    def fix(qualname: str, obj: object) -> None:
        if id(obj) in seen or not _private(getattr(obj, "__module__", None) or ""):
            return
        own = vars(obj).get("__annotations__") if isinstance(obj, type) else None
        if own:
            # typing.get_type_hints (cattrs, attrs) resolves a class's annotations in
            # the namespace of its __module__: resolve them at home first. (Where names
            # were imported for type checking only, they resolve nowhere anyway.)
            with contextlib.suppress(Exception):
                hints = typing.get_type_hints(obj, include_extras=True)
                obj.__annotations__ = {n: hints.get(n, v) for n, v in own.items()}
        seen.add(id(obj))
        obj.__module__ = module
        if isinstance(obj, type):
            for attr, value in vars(obj).items():
                if callable(value) and getattr(value, "__qualname__", "").startswith(qualname):
                    fix(f"{qualname}.{attr}", value)

    for name, value in list(namespace.items()):
        if not name.startswith("_") and (isinstance(value, type) or callable(value)):
            fix(getattr(value, "__qualname__", name), value)


def moved(module: str, to: str, renamed: dict[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names of ``module`` that moved to the module ``to``
    (every name of its ``__all__``) or were renamed there (``renamed``: old name to new
    name): each still resolves, with a :class:`DeprecationWarning` naming its new place.
    """
    renamed = renamed or {}

    def __getattr__(name: str) -> Any:
        target = importlib.import_module(to)
        new = renamed.get(name, name if name in getattr(target, "__all__", ()) else None)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is now {to}.{new}: import it from there "
            f"({module}.{name} goes away in a later release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(target, new)

    return __getattr__
