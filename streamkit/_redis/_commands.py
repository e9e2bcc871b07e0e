"""Running commands the layer's way: Lua scripts by digest, blocking commands with a deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs
import coredis.exceptions
import trio

from .. import _lua
from .._errors import ConfigError, RedisUnavailable
from ._hot import HotConnection, HotRequest, evalsha, pack, script_load
from ._pool import Pool
from ._routing import own
from ._translate import redis_errors

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ._routing import Redis

__all__ = [
    "NOT_LOADED",
    "LuaScript",
    "ScriptCall",
    "can_run_blocking_between",
    "run_blocking",
    "run_blocking_between",
]

T = TypeVar("T")


class _NotLoaded:
    def __repr__(self) -> str:
        return "NOT_LOADED"


#: The reply of a script call that the server refused because it lacked the script (it
#: ran nothing; the script is loaded for the next call): see :func:`run_blocking_between`.
NOT_LOADED: Any = _NotLoaded()


def _missing(reply: object) -> bool:
    """Whether a reply says the server lacked the script an ``EVALSHA`` named."""
    return isinstance(reply, coredis.exceptions.NoScriptError)


def _as_script(script: _lua.Script | str) -> _lua.Script:
    return script if isinstance(script, _lua.Script) else _lua.inline(script)


@attrs.frozen
class LuaScript:
    """A script of :mod:`streamkit._lua`, run by its SHA1 digest (``EVALSHA``), loaded
    on first need.

    coredis's own ``Script`` wraps each call in three request objects, which
    normalise every argument three times: noticeable for a fenced acknowledgement
    carrying hundreds of ids. This sends one ``EVALSHA`` and, only if the server
    does not know the script yet (a new or restarted server, a promoted replica), loads
    it on that node and sends the call once more: safe, since a refused ``EVALSHA``
    ran nothing.

    A *hot* script, one run for every batch of events or jobs (the fenced read and
    acknowledgement, the producer's append, the job claim, finish and enqueue), runs
    on the client's hot connections, packed and parsed by hiredis (see :mod:`._hot`),
    with the same guarantees and errors.

    Attributes:
        script: the script (its text alone makes an inline one, as a test's).
        hot: whether it runs on the hot path.
        sha: its SHA1 digest.
    """

    script: _lua.Script = attrs.field(converter=_as_script)
    hot: bool = attrs.field(default=False, kw_only=True)
    sha: str = attrs.field(init=False)

    @sha.default
    def _sha(self) -> str:
        return self.script.sha

    @property
    def source(self) -> str:
        """The script's text, as sent to Redis."""
        return self.script.text

    async def __call__(self, redis: Redis, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
        """Run the script on ``redis``; errors are coredis's (wrap in :func:`redis_errors`)."""
        run = evalsha if self.hot else _evalsha
        try:
            return await run(redis, self.sha, keys, args)
        except coredis.exceptions.NoScriptError:
            pass
        # The node lacks it (new, restarted, or a replica just promoted). Loaded on
        # the node that owns the keys as the client knows it, not on every node of a
        # cluster (which fails while one of them fails over). A layout behind a
        # failover learns the new owner from the call's redirection, so a second
        # round reaches it; past that, every node.
        for _ in range(2):
            await self.load(redis, keys)
            try:
                return await run(redis, self.sha, keys, args)
            except coredis.exceptions.NoScriptError:
                pass
        await redis.script_load(self.source)
        return await run(redis, self.sha, keys, args)

    async def load(self, redis: Redis, keys: Sequence[str | bytes] = ()) -> None:
        """Load the script where a call on ``keys`` runs (ahead of a call that cannot
        load it itself, as one behind a blocking command that is often cancelled).

        Error handling: coredis's errors (wrap in :func:`redis_errors`).
        """
        await script_load(redis, self.source, keys)


async def _evalsha(redis: Redis, sha: str, keys: Sequence[str | bytes], args: Sequence[Any]) -> Any:
    return await redis.evalsha(sha, keys=keys, args=args)


async def run_blocking(
    redis: Redis,
    fn: Callable[[Redis], Awaitable[T]],
    *,
    within: float,
    what: str,
) -> T:
    """Await one blocking command, ``fn(redis)``, on a connection of its own.

    ``fn`` sends one blocking command (``XREAD ... BLOCK``, ``XREADGROUP ... BLOCK``,
    ``BLMOVE``, ``BZPOPMIN``, ...) through ``redis``, e.g.
    ``lambda r: r.xread({key: last_id}, count=1, block=1000)``. A client from
    :func:`open_redis` sends every blocking command on a dedicated connection, which
    carries nothing else while the command runs.

    ``within`` is the client-side deadline: the command's own block time plus a
    margin for a slow server.

    Cancellation:
        Cancelling discards the command's dedicated connection (the server may still
        be blocked on it) and frees its slot; no other command is touched.

    Error handling:
        :class:`ConfigError` if ``redis`` did not come from :func:`open_redis` (it
        would block on a shared connection). :class:`RedisUnavailable` if there is no
        answer within ``within`` seconds or Redis cannot be reached; :class:`OutcomeUnknown`
        if the connection was lost meanwhile (for a plain ``XREAD`` that is harmless:
        read again); other errors as by :func:`redis_errors`.
    """
    url = own(redis, "blocking commands")._health.url
    try:
        with redis_errors(url), trio.fail_after(within):
            return await fn(redis)
    except trio.TooSlowError as exc:
        raise RedisUnavailable(url, f"{what} got no answer within {within:g}s") from exc


#: A script call: the script, its keys, its arguments.
ScriptCall = tuple[LuaScript, "Sequence[str | bytes]", "Sequence[bytes | str | int]"]


async def run_blocking_between(
    redis: Redis,
    blocking: Sequence[bytes | str | int],
    *,
    before: Sequence[ScriptCall] = (),
    after: ScriptCall,
    replies_before: list[Any],
    within: float,
    what: str,
) -> tuple[Any, Any]:
    """Send script calls, one blocking command and one more script call, in one write
    on a dedicated hot connection (packed and parsed by hiredis, see :mod:`._hot`):
    Redis runs the ``before`` calls at once, then blocks, and runs ``after`` the moment
    the blocking command returns, so that its reply follows with no round trip in
    between.

    ``blocking`` is the whole command (``[b"XREAD", b"COUNT", 1, b"BLOCK", ...]``).
    Returns its reply (as hiredis parses it: a RESP3 map is a ``dict``) and
    ``after``'s.
    ``replies_before`` receives the reply of each ``before`` call, in order, as it
    comes (before the blocking command returns); where the call is cancelled or fails,
    those missing are unknown. A script call's reply may be the exception it ended
    with: :data:`NOT_LOADED` when the server did not know the script (it ran nothing,
    and is loaded for the next call). Only for a client of one server from
    :func:`open_redis` (see :func:`can_run_blocking_between`).

    Cancellation:
        As :func:`run_blocking`: the dedicated connection is discarded. ``after`` may
        have run (the blocking command may have returned as the connection closed).

    Error handling:
        As :func:`run_blocking`; if the blocking command fails, ``after`` may have run.
        :class:`ConfigError` for a cluster's client or one not from :func:`open_redis`.
    """
    pool = _blocking_pool(redis)
    if pool is None:
        raise ConfigError(
            "redis",
            "script calls around a blocking command need a client of one server from open_redis",
        )
    url = own(redis, "blocking commands")._health.url

    def call(connection: HotConnection, script_call: ScriptCall) -> HotRequest:
        script, keys, args = script_call
        return connection.send_packed(
            pack((b"EVALSHA", script.sha, len(keys), *keys, *args)),
            blocking=True,
            raise_exceptions=False,
        )

    try:
        with redis_errors(url), trio.fail_after(within):
            connection = cast("HotConnection", await pool.get_connection())
            try:
                firsts = [call(connection, c) for c in before]
                request = connection.send_packed(
                    pack(blocking), command=cast("bytes", blocking[0]), blocking=True
                )
                then = call(connection, after)
                try:
                    for first in firsts:
                        replies_before.append(await first)  # noqa: PERF401 (as each comes)
                    reply = await request
                finally:
                    # Read the last reply in any case: the connection goes back to the
                    # pool with nothing in flight on it.
                    last = await then
            finally:
                pool.release(connection)
    except trio.TooSlowError as exc:
        raise RedisUnavailable(url, f"{what} got no answer within {within:g}s") from exc
    missing = {
        script
        for (script, _, _), answer in zip([*before, after], [*replies_before, last], strict=True)
        if _missing(answer)
    }
    if missing:
        replies_before[:] = [NOT_LOADED if _missing(a) else a for a in replies_before]
        last = NOT_LOADED if _missing(last) else last
        with redis_errors(url):
            for script in missing:
                await script.load(redis)
    return reply, last


def can_run_blocking_between(redis: Redis) -> bool:
    """Whether :func:`run_blocking_between` can send scripts around a blocking command on
    ``redis``: a client of one server from :func:`open_redis`, outside
    :func:`replicated` (a Redis Cluster's blocking commands name one slot's keys)."""
    return _blocking_pool(redis) is not None


def _blocking_pool(redis: Redis) -> Pool | None:
    dedicated = getattr(redis, "_dedicated", None)
    pool = getattr(redis, "_hot_dedicated_pool", None)
    if dedicated is None or dedicated.requires_wait or not isinstance(pool, Pool):
        return None
    return pool
