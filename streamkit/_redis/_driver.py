"""The Trio driver of the operations (:mod:`streamkit._ops`): their requests run on coredis.

An operation yields what it needs (a script call, a batch of them, a sleep, the time)
and decides everything else itself; :func:`run_op` does what it asks on a client from
:func:`~streamkit.open_redis`, the way the blocking and asyncio clients' drivers do on
redis-py:

* a :class:`~streamkit._ops.Call` of a script runs through :class:`~._commands.LuaScript`
  (on the hot path for the hot scripts, see :mod:`._hot`), which loads a script the
  server lacks, in its one place; its error, translated (:func:`~._translate.redis_errors`),
  is thrown into the operation;
* a :class:`~streamkit._ops.CallBatch` runs its calls at once (each in a task of one
  nursery: the hot connections carry them together, as a pipeline would), inside
  :func:`~._replicas.replicated` when it asks for replicas; each call's error is its
  reply;
* :class:`~streamkit._ops.Sleep` is ``trio.sleep``, :data:`~streamkit._ops.NOW` is
  ``trio.current_time()`` (a test's ``MockClock`` drives the retries).

Plain commands (the clients' table reads, shaped by redis-py's replies) are not run
here: the operations the Trio side drives call scripts only.

Cancellation:
    Cancelling :func:`run_op` closes the operation (``GeneratorExit`` at its yield), so
    that its own clean-up runs (an append gives its markers back), and cancels the
    calls in flight as :class:`~._commands.LuaScript` does: nothing is sent again.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .._errors import StreamkitError
from .._ops import Call, CallBatch, Sleep, drive
from ._commands import LuaScript
from ._replicas import replicated
from ._translate import redis_errors

if TYPE_CHECKING:
    from .. import _lua
    from .._ops import Op, Work
    from ._routing import Redis

__all__ = ["HOT_SCRIPTS", "run_op"]

T = TypeVar("T")

#: The scripts an operation runs per batch of records or jobs: on the hot path.
HOT_SCRIPTS = frozenset({"streams/append", "jobs/enqueue"})

# The LuaScript of each script, by digest: one per script and process.
_scripts: dict[str, LuaScript] = {}


def _lua_script(script: _lua.Script) -> LuaScript:
    lua = _scripts.get(script.sha)
    if lua is None:
        lua = _scripts[script.sha] = LuaScript(script, hot=script.name in HOT_SCRIPTS)
    return lua


async def run_op(redis: Redis, op: Op[T]) -> T:
    """Run the operation ``op`` on ``redis``: do what it asks until it returns.

    Error handling:
        What the operation raises. A call's error reaches the operation as
        streamkit's (the operation decides whether it goes again); an error that is
        not a Redis error (a bug) ends the operation where it is raised.
    """
    return await drive(op, functools.partial(_do, redis), trio.current_time)


async def _do(redis: Redis, request: Work) -> Any:
    if type(request) is Call:
        # Inline (not _call): one coroutine less on the path of every single call.
        script = request.script
        if script is None:
            raise TypeError(f"the Trio driver runs script calls only, not {request.args[0]!r}")
        args = request.args
        numkeys = args[2]
        with redis_errors():
            return await _lua_script(script)(redis, args[3 : 3 + numkeys], args[3 + numkeys :])
    if type(request) is CallBatch:
        if not request.replicas:
            return await _batch(redis, request.calls)
        with replicated(redis, request.replicas, request.replica_timeout):
            return await _batch(redis, request.calls)
    if type(request) is Sleep:
        await trio.sleep(request.seconds)
        return None
    raise TypeError(f"not a request of an operation: {request!r}")


async def _batch(redis: Redis, calls: tuple[Call, ...]) -> list[Any]:
    replies: list[Any] = [None] * len(calls)

    async def one(i: int) -> None:
        try:
            replies[i] = await _do(redis, calls[i])
        except StreamkitError as exc:
            replies[i] = exc

    if len(calls) == 1:
        await one(0)
        return replies
    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(one, i)
    return replies
