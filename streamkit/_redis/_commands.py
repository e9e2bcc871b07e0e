"""Running commands the layer's way: Lua scripts by digest, blocking commands with a deadline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import coredis.exceptions
import trio

from .._acl import remember_script
from .._errors import RedisUnavailable
from ._hot import evalsha, script_load
from ._routing import own
from ._translate import redis_errors

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from ._routing import Redis

__all__ = ["LuaScript", "run_blocking"]

T = TypeVar("T")


@attrs.frozen
class LuaScript:
    """A Lua script, run by its SHA1 digest (``EVALSHA``), loaded on first need.

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
        source: the script's Lua source.
        hot: whether it runs on the hot path.
        sha: its SHA1 digest.
    """

    source: str
    hot: bool = attrs.field(default=False, kw_only=True)
    sha: str = attrs.field(init=False)

    @sha.default
    def _sha(self) -> str:
        # The same SHA1, remembering the source so that an ACL refusal inside the
        # script can name its command.
        return remember_script(self.source)

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
            await script_load(redis, self.source, keys)
            try:
                return await run(redis, self.sha, keys, args)
            except coredis.exceptions.NoScriptError:
                pass
        await redis.script_load(self.source)
        return await run(redis, self.sha, keys, args)


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
