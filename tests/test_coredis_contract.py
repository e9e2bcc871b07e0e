"""What the hot path (``streamkit/_redis/_hot.py``) needs of coredis's insides.

A hot connection is a coredis connection whose replies hiredis parses and which writes
packed requests itself: it reads and writes 11 private attributes of coredis's
``BaseConnection`` and overrides 3 of its private methods, which coredis's own
``run()`` and reader task must go on calling. pyproject.toml pins coredis exactly;
before moving the pin, run this file against the new version: each test names one
thing the hot path relies on, and fails saying what changed. (``test_redis_hot.py``
tests that the hot path behaves as coredis's own.)
"""

from __future__ import annotations

import collections
import inspect
import re
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import coredis
import coredis.exceptions
import pytest
import trio
from coredis.cluster._layout import ClusterLayout
from coredis.connection import BaseConnection, TCPConnection, TCPLocation
from coredis.connection._request import BaseRequest
from coredis.connection._statistics import ConnectionStatistics
from coredis.parser import Parser

from streamkit._redis._hot import HotConnection, HotRequest, HotTransaction, pack

if TYPE_CHECKING:
    from collections.abc import Callable

    from streamkit.testing import RedisServer

pytestmark = pytest.mark.timeout(30)

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _pinned() -> str:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pins = [d for d in dependencies if re.match(r"coredis\b", d)]
    assert len(pins) == 1, pins
    match = re.fullmatch(r"coredis==([\w.]+)", pins[0])
    assert match, f"pyproject.toml must pin coredis exactly (coredis==X.Y.Z), not {pins[0]!r}"
    return match.group(1)


def test_the_installed_coredis_is_the_pinned_one() -> None:
    assert coredis.__version__ == _pinned(), (
        f"coredis {coredis.__version__} is installed, pyproject.toml pins {_pinned()}: "
        "the hot path (streamkit/_redis/_hot.py) is known to work with the pinned one"
    )


# --- the private attributes: what _hot.py does with each, and the shape it needs ----


def _stream_of(*methods: str) -> Callable[[Any], bool]:
    return lambda value: all(callable(getattr(value, m, None)) for m in methods)


def _receive_stream(value: Any) -> bool:
    statistics = value.statistics()
    return _stream_of("receive", "receive_nowait")(value) and all(
        isinstance(getattr(statistics, n, None), int)
        for n in ("tasks_waiting_receive", "current_buffer_used")
    )


def _optional_number(value: Any) -> bool:
    return value is None or isinstance(value, int | float)


ATTRIBUTES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "_last_error": (
        "send_packed raises from it: the error that ended the connection, or None",
        lambda value: value is None or isinstance(value, BaseException),
    ),
    "_stream_timeout": (
        "a hot request's response timeout: seconds or None",
        _optional_number,
    ),
    "_requests": (
        (
            "the requests in flight, oldest first: a deque send_packed appends to and the "
            "reader completes from the left"
        ),
        lambda value: isinstance(value, collections.deque),
    ),
    "_write_buffer_in": (
        "what the writer task is to write: a memory stream with send_nowait([(cmd, args)])",
        _stream_of("send_nowait"),
    ),
    "_write_buffer_out": (
        (
            "the writer task's end of it: receive(), receive_nowait(), and statistics() "
            "with tasks_waiting_receive and current_buffer_used"
        ),
        _receive_stream,
    ),
    "_push_message_buffer_in": (
        "where a RESP3 push message goes: send_nowait(message)",
        _stream_of("send_nowait"),
    ),
    "_streamed_message_buffer_in": (
        "where a reply with no request in flight goes: send_nowait(reply)",
        _stream_of("send_nowait"),
    ),
    "_max_idle_time": (
        "the reader's idle deadline: seconds or None (then the hot reader runs, with none)",
        _optional_number,
    ),
    "_processing_budget": (
        "what limits the handling of push messages: an async context manager",
        lambda value: hasattr(value, "__aenter__") and hasattr(value, "__aexit__"),
    ),
    "_packer": (
        "packs the writer task's commands: pack_commands([(cmd, *args)]) -> bytes chunks",
        lambda value: b"".join(value.pack_commands([(b"PING",)])) == pack((b"PING",)),
    ),
    "_transport_failed": (
        "set when the stream broke, as coredis's reader and writer tasks do: a bool",
        lambda value: isinstance(value, bool),
    ),
}


@pytest.mark.parametrize("name", sorted(ATTRIBUTES))
def test_a_private_attribute_the_hot_path_uses(name: str) -> None:
    connection = TCPConnection(TCPLocation("127.0.0.1", 6379))
    use, shaped = ATTRIBUTES[name]
    assert hasattr(connection, name), (
        f"coredis {coredis.__version__}: BaseConnection has no {name} any more; "
        f"streamkit/_redis/_hot.py uses it as {use}"
    )
    assert shaped(getattr(connection, name)), (
        f"coredis {coredis.__version__}: BaseConnection.{name} is now "
        f"{getattr(connection, name)!r}; streamkit/_redis/_hot.py uses it as {use}"
    )


# --- the private methods HotConnection overrides -----------------------------------

OVERRIDDEN = {
    "_data_received": "parses what the reader task received (hiredis instead of coredis)",
    "_reader_task": "receives from the stream (without an idle deadline when there is none)",
    "_writer_task": "writes the queued commands and the requests packed already",
}


def test_this_file_checks_all_the_hot_path_touches() -> None:
    """Every private attribute _hot.py reads or writes that is not its own is in the
    table above, and every private method of coredis's that HotConnection overrides in
    the one below: what the hot path starts to touch is checked here too."""
    source = Path(inspect.getfile(HotConnection)).read_text()
    named = set(re.findall(r"\bself\.(_[a-z]\w*)", source))
    own = {"_hot_reader", "_hot_socket", "_hot_socket_of"}
    own |= set(HotRequest.__slots__) | set(HotTransaction.__slots__)
    own |= {
        name
        for name in vars(HotConnection) | vars(HotRequest) | vars(HotTransaction)
        if name.startswith("_")
    }
    assert named - own == set(ATTRIBUTES), sorted(named - own)
    overridden = {
        name
        for name in vars(HotConnection)
        if name.startswith("_")
        and not name.startswith("__")
        and callable(vars(HotConnection)[name])
        and hasattr(BaseConnection, name)
    }
    assert overridden == set(OVERRIDDEN), sorted(overridden)


def _parameters(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """A signature without its annotations (written as strings or not)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_an_overridden_method_keeps_its_signature(name: str) -> None:
    theirs = getattr(BaseConnection, name, None)
    assert theirs is not None, (
        f"coredis {coredis.__version__}: BaseConnection.{name} is gone; HotConnection "
        f"overrides it ({OVERRIDDEN[name]}), and now would never be called"
    )
    ours = vars(HotConnection)[name]
    assert _parameters(theirs) == _parameters(ours), (
        f"coredis {coredis.__version__}: BaseConnection.{name}{inspect.signature(theirs)} "
        f"is not what HotConnection overrides it with: {name}{inspect.signature(ours)}"
    )
    assert inspect.iscoroutinefunction(theirs) == inspect.iscoroutinefunction(ours), (
        f"coredis {coredis.__version__}: BaseConnection.{name} is "
        f"{'now' if inspect.iscoroutinefunction(theirs) else 'no longer'} async"
    )


async def _calls_of_a_spy(port: int, max_idle_time: int | None) -> set[str]:
    """Which overrides a hot connection's handshake and a packed PING went through."""
    calls: set[str] = set()

    class Spy(HotConnection, TCPConnection):
        def _data_received(self, data: bytes) -> None:
            calls.add("_data_received")
            super()._data_received(data)

        async def _reader_task(self) -> None:
            calls.add("_reader_task")
            await super()._reader_task()

        async def _writer_task(self) -> None:
            calls.add("_writer_task")
            await super()._writer_task()

    connection = Spy(TCPLocation("127.0.0.1", port), max_idle_time=max_idle_time)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run)
            reply = await connection.send_packed(pack((b"PING",)), command=b"PING")
            connection.invalidate("done")
    assert reply == b"PONG"
    return calls


@pytest.mark.parametrize("max_idle_time", [None, 60])
async def test_coredis_still_calls_the_overridden_methods(
    redis_server: RedisServer, max_idle_time: int | None
) -> None:
    """coredis's run() starts the reader and writer tasks and its reader task hands
    what it receives to _data_received: a hot connection's handshake and a packed
    request go through the three overrides, with and without an idle deadline (then
    HotConnection._reader_task hands over to coredis's own)."""
    calls = await _calls_of_a_spy(redis_server.port, max_idle_time)
    assert calls == set(OVERRIDDEN), (
        f"coredis {coredis.__version__} (max_idle_time={max_idle_time}) no longer calls "
        f"{sorted(set(OVERRIDDEN) - calls)} of its connection: HotConnection's overrides "
        "would never run"
    )


# --- the rest: what a hot request must be to coredis, the errors, the layout -------


def test_a_hot_request_is_enough_of_a_coredis_request() -> None:
    """coredis's connection completes and fails the requests in flight through the
    abstract members of its BaseRequest; a HotRequest has them all but the two that only
    coredis's _data_received reads (which a hot connection overrides)."""
    abstract = set(BaseRequest.__abstractmethods__)
    missing = abstract - set(dir(HotRequest)) - {"current_decode", "current_encoding"}
    assert not missing, (
        f"coredis {coredis.__version__}: its requests now need {sorted(missing)}, "
        "which streamkit/_redis/_hot.py's HotRequest lacks"
    )


@pytest.mark.parametrize(
    ("owner", "name", "parameters"),
    [
        pytest.param(owner, name, parameters, id=f"{owner.__name__}.{name}")
        for owner, name, parameters in [
            (BaseConnection, "invalidate", ["self", "reason"]),
            (ConnectionStatistics, "request_created", ["self", "count"]),
            (ConnectionStatistics, "request_resolved", ["self"]),
            (ConnectionStatistics, "data_sent", ["self", "num_bytes"]),
            (ConnectionStatistics, "data_received", ["self", "num_bytes"]),
            (Parser, "parse_error", ["self", "response"]),
            (ClusterLayout, "node_for_slot", ["self", "slot", "primary"]),
            (ClusterLayout, "report_errors", ["self", "node", "errors"]),
        ]
    ],
)
def test_a_method_the_hot_path_calls(owner: type, name: str, parameters: list[str]) -> None:
    method = getattr(owner, name, None)
    assert callable(method), f"coredis {coredis.__version__}: {owner.__name__}.{name} is gone"
    assert list(inspect.signature(method).parameters) == parameters, (
        f"coredis {coredis.__version__}: {owner.__name__}.{name}"
        f"{inspect.signature(method)}, where streamkit/_redis/_hot.py calls it with "
        f"({', '.join(parameters)})"
    )


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("MOVED 3999 127.0.0.1:6381", coredis.exceptions.MovedError),
        ("ASK 3999 127.0.0.1:6381", coredis.exceptions.AskError),
        ("TRYAGAIN Multiple keys request during rehashing", coredis.exceptions.TryAgainError),
        ("CLUSTERDOWN The cluster is down", coredis.exceptions.ClusterDownError),
        ("NOSCRIPT No matching script", coredis.exceptions.NoScriptError),
        ("ERR no such thing", coredis.exceptions.ResponseError),
    ],
)
def test_error_replies_become_coredis_exceptions_the_hot_path_knows(
    reply: str, error: type[Exception]
) -> None:
    """_hot.py turns Redis's error replies into coredis's exceptions with coredis's
    parser, and follows a cluster's redirections by their classes (a MOVED being an
    ASK to it)."""
    parsed = Parser().parse_error(reply)
    assert type(parsed) is error, (
        f"coredis {coredis.__version__}: {reply!r} parses as {type(parsed).__name__}, "
        f"not {error.__name__}"
    )
    assert issubclass(coredis.exceptions.MovedError, coredis.exceptions.AskError), (
        f"coredis {coredis.__version__}: MovedError is no longer an AskError; "
        "streamkit/_redis/_hot.py's _REDIRECTIONS names AskError alone for both"
    )
    assert issubclass(error, coredis.exceptions.RedisError)
