"""Loading the user's code: ``MODULE:NAME`` paths to an app, a stream or a processor.

An import that fails shows the user's own traceback (without importlib's and
streamkit's frames) under a one-line header; every other mistake is one line, exit
code 2.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

import attrs

from .._app import App, inner_stream_of
from .._errors import ConfigError, MetadataMismatch, StreamkitError
from .._streams import Stream
from .._worker import select_processors
from ._exits import fail

if TYPE_CHECKING:
    from .._app import Processor
    from .._settings import Settings

__all__ = [
    "app_of",
    "import_failure",
    "load_app",
    "load_module",
    "load_object",
    "load_processor",
    "load_stream",
    "one_shot_settings",
    "user_frame",
    "with_stream_path",
]

#: streamkit's own directory: its frames are left out of the user's tracebacks.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def a(noun: str) -> str:
    """``noun`` after its indefinite article: ``a Stream``, ``an App``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def load_object(path: str) -> Any:
    """Import ``module:attribute`` (``attribute`` may be dotted) and return it."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        fail(f"expected MODULE:NAME (for example myapp.streams:orders), got {path!r}", 2)
    target: Any = load_module(module_name, attribute)
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            fail(f"{module_name!r} has no attribute {attribute!r}", 2)
    return target


def load_module(module_name: str, attribute: str = "NAME") -> Any:
    """Import the user's module ``module_name`` (from the working directory first)."""
    # Like `python -m`, look in the working directory first.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and _is_parent_or_same(exc.name, module_name):
            why = not_found(module_name, exc.name, attribute)
            fail(f"cannot import {module_name!r}: {why}", 2)
        fail(import_failure(module_name, exc), 2)
    except StreamkitError as exc:
        where = user_frame(exc)
        fail(f"importing {module_name!r} failed{where}: {exc}", 2)
    except Exception as exc:
        fail(import_failure(module_name, exc), 2)


def not_found(module_name: str, missing: str, attribute: str = "NAME") -> str:
    """Why ``module_name`` was not found, saying where it was looked for, and what the
    user may have meant: a file's name (``shop.py``) for a module's, a near miss."""
    if module_name.endswith(".py"):
        module = module_name.removesuffix(".py").replace(os.sep, ".").strip(".")
        return f"MODULE is a module's name, not a file's: drop the .py ({module}:{attribute})"
    here = os.getcwd()
    parent, _, name = missing.rpartition(".")
    folder = os.path.join(here, *parent.split(".")) if parent else here
    try:
        entries = os.listdir(folder)
    except OSError:
        entries = []
    nearby = [
        entry.removesuffix(".py")
        for entry in sorted(entries)
        if not entry.startswith((".", "_"))
        and (entry.endswith(".py") or os.path.isfile(os.path.join(folder, entry, "__init__.py")))
    ]
    where = (
        f"no module named {missing!r} in {here} (the working directory) or in the "
        f"installed packages"
    )
    close = difflib.get_close_matches(name, nearby, n=1)
    if not close:
        return where
    meant = f"{parent}.{close[0]}" if parent else close[0]
    return f"{where}; did you mean {meant!r}?"


def _is_parent_or_same(missing: str, module_name: str) -> bool:
    """Whether the module that was not found is ``module_name`` or one of its packages."""
    return module_name == missing or module_name.startswith(missing + ".")


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback outside importlib and this command line."""
    frames = traceback.extract_tb(exc.__traceback__)
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    return [
        frame
        for frame in frames
        if "importlib" not in frame.filename and not frame.filename.startswith(here)
    ]


def user_frame(exc: BaseException) -> str:
    """Where the user's code raised ``exc``: " at FILE line N", or "" if unknown.

    That is the user's call into streamkit (the frame before the first of streamkit's),
    not a frame streamkit's own calls went through on the way to the error: code that
    attrs generated for a class of streamkit's (``<attrs generated methods ...>``),
    attrs' validators. An error the user's code raised itself is placed at its last
    frame.
    """
    frames = _user_frames(exc)
    for i, frame in enumerate(frames):
        if _is_streamkit(frame):
            frames = frames[:i]
            break
    # (Code compiled from no file, such as attrs', is nobody's file and line.)
    frames = [f for f in frames if not f.filename.startswith("<")]
    if not frames:
        return ""
    return f" at {os.path.relpath(frames[-1].filename)} line {frames[-1].lineno}"


def _is_streamkit(frame: traceback.FrameSummary) -> bool:
    return frame.filename.startswith(_PACKAGE_DIR + os.sep)


def import_failure(module_name: str, exc: BaseException) -> str:
    """A one-line header, then the user's own traceback (without streamkit's frames)."""
    lines = traceback.format_list(_user_frames(exc))
    lines += traceback.format_exception_only(type(exc), exc)
    body = "".join(["Traceback (most recent call last):\n", *lines]).rstrip()
    return f"module {module_name!r} failed to import; its traceback:\n{body}"


def with_stream_path(exc: BaseException, path: str) -> str:
    """``exc``'s message, with the stream's real MODULE:STREAM in a delete-stream hint.

    ``path`` is the stream's own path, or the path of anything in its module (an app).
    """
    message = str(exc)
    if not isinstance(exc, MetadataMismatch) or "MODULE:STREAM" not in message:
        return message
    module_name = path.partition(":")[0]
    module = sys.modules.get(module_name)
    for name, value in vars(module).items() if module is not None else ():
        if isinstance(value, Stream) and value.name == exc.stream:
            return message.replace("MODULE:STREAM", f"{module_name}:{name}")
    return message


def load_stream(
    path: str,
    redis_url: str | None,
    *,
    one_shot: bool = True,
    by_name: bool = False,
    sending: bool = False,
) -> tuple[App, Stream[Any]]:
    """The stream at ``path`` and the app that declared it (with ``--redis-url``), set
    for a one-shot command unless ``one_shot=False`` (see :func:`one_shot_settings`).

    With ``by_name``, ``MODULE:NAME`` may also be the name of a stream an app of the
    module declares (an output made where it is used: ``app.stream("totals", ...)``).
    With ``sending``, too, but an inner stream (a join's, a table's) is refused, saying
    whose it is (exit code 2): streamkit alone writes those.
    """
    by_name = by_name or sending
    module_name, _, name = path.partition(":")
    stream: Any = None
    if by_name and module_name and name and "." not in name:
        module = load_module(module_name, name)
        stream = getattr(module, name, None)
        if not isinstance(stream, Stream):
            declared = [
                app.streams[name]
                for app in vars(module).values()
                if isinstance(app, App) and name in app.streams
            ]
            stream = declared[0] if declared else stream
    if stream is None:
        stream = load_object(path)
    if not isinstance(stream, Stream):
        fail(f"{path} is {a(type(stream).__name__)}, not a stream made by app.stream(...)", 2)
    app = app_of(path, stream)
    if sending:
        _refuse_inner(path, app, stream)
    _configure(app, redis_url, one_shot)
    return app, stream


def _refuse_inner(path: str, app: App, stream: Stream[Any]) -> None:
    """Fail (exit code 2) if ``stream`` is an inner stream, saying what to send to."""
    inner = inner_stream_of(app, stream)
    if inner is None:
        return
    kind, name = inner
    if kind == "join":
        sides = [app.processors[f"{name}__{side}"].stream.name for side in ("left", "right")]
        source = f"the streams it joins ({', '.join(sides)}); send to those instead"
    else:
        tables = [
            table.name
            for table in app.tables.values()
            if any(spec is stream.spec for spec, _ in getattr(table, "feeds", ()))
        ]
        which = (
            f"the table {tables[0]}" if len(tables) == 1 else f"the tables {' and '.join(tables)}"
        )
        source = f"the writes of {which}; write {'that' if len(tables) == 1 else 'those'} instead"
    fail(f"{path} is the inner stream of {kind} {name!r}: streamkit writes it, from {source}", 2)


def one_shot_settings(settings: Settings) -> Settings:
    """``settings`` for a one-shot command: an unreachable Redis is retried for
    ``command_give_up_after`` seconds at most, not a worker's ``connect_give_up_after``."""
    patience = settings.connect_give_up_after
    if patience is not None and patience <= settings.command_give_up_after:
        return settings
    return attrs.evolve(settings, connect_give_up_after=settings.command_give_up_after)


def _configure(app: App, redis_url: str | None, one_shot: bool) -> None:
    if redis_url is not None:
        app.settings = attrs.evolve(app.settings, redis_url=redis_url)
    if one_shot:
        app.settings = one_shot_settings(app.settings)


def app_of(path: str, stream: Stream[Any]) -> App:
    """The app that declared ``stream``, found beside it in its module."""
    module = sys.modules[path.partition(":")[0]]
    found = [
        candidate
        for candidate in vars(module).values()
        if isinstance(candidate, App) and candidate.streams.get(stream.name) is stream
    ]
    if not found:
        fail(f"{path}: the app that declared this stream is not in its module", 2)
    return found[0]


def load_app(path: str, redis_url: str | None, *, one_shot: bool = True) -> App:
    """The app at ``path`` (with ``--redis-url``), set for a one-shot command unless
    ``one_shot=False`` (a worker, a watch: they ride out an outage)."""
    app = load_object(path)
    if not isinstance(app, App):
        fail(f"{path} is {a(type(app).__name__)}, not a streamkit App", 2)
    _configure(app, redis_url, one_shot)
    return app


def load_processor(app: App, name: str) -> Processor:
    """The processor of ``app`` named ``name``."""
    try:
        [processor] = select_processors(app, [name])
    except ConfigError as exc:
        fail(str(exc), 2)
    return processor
