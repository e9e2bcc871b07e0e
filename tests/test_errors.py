"""Every error streamkit raises survives pickling (a process pool, say, sends it back
to its caller pickled), with its message and its data."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from typing import Any

import pytest

import streamkit
from streamkit import StreamkitError


def _error_classes() -> list[type[StreamkitError]]:
    for module in pkgutil.walk_packages(streamkit.__path__, "streamkit."):
        if ".spark" not in module.name and not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found: set[type[StreamkitError]] = set()
    todo = [StreamkitError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("streamkit") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return sorted(found, key=lambda cls: cls.__qualname__)


def _made(cls: type[StreamkitError]) -> StreamkitError:
    """An instance of ``cls``, its required parameters given as numbers (or texts,
    or a cause where it wraps one)."""
    arguments: list[Any] = []
    keywords: dict[str, Any] = {}
    for index, parameter in enumerate(inspect.signature(cls).parameters.values()):
        if parameter.default is not parameter.empty or parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        value: Any = index + 7
        if parameter.name == "cause":
            value = LookupError("the cause")
        if parameter.kind is parameter.KEYWORD_ONLY:
            keywords[parameter.name] = value
        else:
            arguments.append(value)
    return cls(*arguments, **keywords)


ERRORS = _error_classes()


def test_the_sweep_finds_the_errors_of_every_layer() -> None:
    names = {cls.__name__ for cls in ERRORS}
    assert {"ConfigError", "LockLost", "JobFailed", "ServerRefused", "ResetIncomplete"} <= names
    assert len(ERRORS) >= 25


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_an_error_pickles_with_its_message_and_data(cls: type[StreamkitError]) -> None:
    error = _made(cls)
    error.add_note("a note added on the way")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls
    assert str(again) == str(error)
    assert again.args == error.args
    public = {k: v for k, v in vars(error).items() if not k.startswith("_") and k != "cause"}
    assert {k: v for k, v in vars(again).items() if k in public} == public
    assert again.__notes__ == ["a note added on the way"]
