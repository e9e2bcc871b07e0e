"""The command line's mistakes and precedence: one clear line, the right URL, whole help."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import asyncclick as click
import pytest
import trio

from streamkit.testing import free_port
from tests import cli_forkserver
from tests.test_cli import ORDERS, ROOT, Result, assert_no_traceback, streamkit

if TYPE_CHECKING:
    from pathlib import Path

    from streamkit import Redis

APP_MODULE = """
import os
from streamkit import App, Events, Record

app = App("prec", redis_url=os.environ["PREC_URL"])


class Item(Record):
    key: str


items = app.stream("items", record=Item, partition_by="key", partition_count=2)


@app.processor(items)
async def handle(events: Events[Item]) -> None:
    async for _ in events.records():
        pass
"""


async def run_in(directory: Path, *args: str, env: dict[str, str], stdin: bytes = b"") -> Result:
    """``streamkit ARGS`` run in ``directory`` (where the user's modules are)."""
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STREAMKIT_CONNECT_GIVE_UP_AFTER": "0",
        **env,
    }
    with trio.fail_after(60):
        code, out, err = await cli_forkserver.run(
            list(args), cwd=directory, env=environment, stdin=stdin
        )
    return Result(code, out.decode(), err.decode())


async def test_app_keyword_arguments_win_over_the_environment(
    redis_url: str, redis: Redis, tmp_path: Path
) -> None:
    (tmp_path / "precapp.py").write_text(APP_MODULE)
    nowhere = f"redis://127.0.0.1:{free_port()}"
    env = {"PREC_URL": redis_url, "STREAMKIT_REDIS_URL": nowhere}
    sent = await run_in(tmp_path, "send", "precapp:items", '{"key": "a"}', env=env)
    assert sent.code == 0, sent.err
    status = await run_in(tmp_path, "status", "precapp:app", env=env)
    assert status.code == 0, status.err
    assert f"Redis at {redis_url}" in status.out
    # The flag wins over both.
    flagged = await run_in(
        tmp_path, "status", "precapp:app", "--redis-url", nowhere, env={"PREC_URL": redis_url}
    )
    assert flagged.code == 1
    assert f"Redis at {nowhere} is unavailable" in flagged.err


async def test_a_module_that_fails_to_import_shows_its_own_traceback(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(
        "import json\n\n\ndef f():\n    raise RuntimeError('boom')\n\n\nf()\n"
    )
    result = await run_in(tmp_path, "worker", "broken:app", env={})
    assert result.code == 2
    lines = result.err.splitlines()
    assert lines[0] == "Error: module 'broken' failed to import; its traceback:"
    assert 'broken.py", line 8, in <module>' in result.err
    assert 'broken.py", line 5, in f' in result.err
    assert "RuntimeError: boom" in result.err
    assert "importlib" not in result.err
    assert "_cli" not in result.err


DECLARING = """
from streamkit import App, Record


class Item(Record):
    key: str


app = App("decl")
left = app.stream("left", record=Item, partition_by="key", partition_count=2)
right = app.stream("right", record=Item, partition_by="key", partition_count=2)
out = app.stream("out", record=dict, partition_by=lambda r: r["key"], partition_count=2)
"""


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            'app.join("j", left, right, within="10", output=out)',
            "within: expected a duration (a timedelta, or seconds), got '10'",
        ),
        (
            'app.join("j", left, right, within=10, grace=float("nan"), output=out)',
            "grace: expected a duration (a timedelta, or seconds), got nan",
        ),
        (
            'app.versioned_table("v", value=int, retention="1d")',
            "retention: expected a duration (a timedelta, or seconds), got '1d'",
        ),
        (
            'app.join("j", left, right, within=10, output=out, how="full")',
            "how: must be 'inner', 'left' or 'outer', got 'full'",
        ),
        (
            'app.join("j", left, right, within=10, output=out, batch_size=0)',
            "batch_size: must be a positive integer, got 0",
        ),
        (
            'app.join("j", left, right, within=10, output=out, result="x")',
            (
                "result: must be a function of (key, left record or None, right record or "
                "None), got 'x'"
            ),
        ),
        (
            'app.join("j", left, right, within=10, output=out, idle="no")',
            "idle: must be True or False, got 'no'",
        ),
        (
            'app.join("j", left, right, within=10, output=left)',
            (
                "output: join 'j' cannot emit to its own left stream 'left': each result "
                "would be joined again (give it a stream of its own)"
            ),
        ),
        (
            'app.global_table("a b", value=int)',
            "table name: must be letters, digits, '_' or '-', got 'a b'",
        ),
        (
            'app.global_table("g", value=int, default="x")',
            "default: table 'g': 'x' is not a valid int (expected an integer, got str)",
        ),
        (
            'app.global_table("g", value=int, batch_size=0)',
            "batch_size: must be a positive integer, got 0",
        ),
    ],
    ids=[
        "within",
        "grace",
        "retention",
        "how",
        "batch_size",
        "result",
        "idle",
        "output",
        "global name",
        "global default",
        "global batch_size",
    ],
)
async def test_a_refused_declaration_names_the_users_file_and_line(
    tmp_path: Path, call: str, message: str
) -> None:
    # In a function of the user's, called from the module: the call into streamkit is
    # what the line names, not the module's line that called the function.
    (tmp_path / "declared.py").write_text(
        f"{DECLARING}\n\ndef declare():\n    {call}\n\n\ndeclare()\n"
    )
    line = DECLARING.count("\n") + 4
    result = await run_in(tmp_path, "status", "declared:app", env={})
    assert result.code == 2, result.err
    assert (
        result.err == f"Error: importing 'declared' failed at declared.py line {line}: {message}\n"
    )


async def test_a_missing_module_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "needs.py").write_text("import not_installed_anywhere\n")
    missing = await run_in(tmp_path, "worker", "nothere:app", env={})
    assert missing.code == 2
    assert missing.err.strip() == (
        f"Error: cannot import 'nothere': no module named 'nothere' in {tmp_path} (the "
        f"working directory) or in the installed packages"
    )
    # A module that imports a missing one is the user's own import failure.
    needs = await run_in(tmp_path, "worker", "needs:app", env={})
    assert needs.code == 2
    assert "module 'needs' failed to import" in needs.err
    assert "No module named 'not_installed_anywhere'" in needs.err


async def test_a_mistyped_module_names_where_it_looked_and_what_was_meant(
    tmp_path: Path,
) -> None:
    (tmp_path / "shop.py").write_text("app = None\n")
    mistyped = await run_in(tmp_path, "worker", "shopp:app", env={})
    assert mistyped.code == 2
    assert mistyped.err.strip() == (
        f"Error: cannot import 'shopp': no module named 'shopp' in {tmp_path} (the "
        f"working directory) or in the installed packages; did you mean 'shop'?"
    )
    # A file's name for the module's: drop the .py.
    a_file = await run_in(tmp_path, "worker", "shop.py:app", env={})
    assert a_file.code == 2
    assert a_file.err.strip() == (
        "Error: cannot import 'shop.py': MODULE is a module's name, not a file's: "
        "drop the .py (shop:app)"
    )


async def test_empty_processor_names_are_refused(redis_url: str) -> None:
    result = await streamkit("worker", "tests.apps.failing:app", "-p", ",", redis_url=redis_url)
    assert result.code == 2
    assert "--processors: ',' has an empty processor name" in result.err
    assert "(known: handle)" in result.err
    assert_no_traceback(result)


async def test_help_is_whole(redis_url: str) -> None:
    top = await streamkit("--help", redis_url=redis_url)
    commands = top.out.split("Commands:")[1]
    assert "..." not in commands, top.out
    assert "pending, last event." in commands
    worker = await streamkit("worker", "--help", redis_url=redis_url)
    assert "Least severe log messages to show" in worker.out
    listing = await streamkit("deadletters", "list", "--help", redis_url=redis_url)
    assert "says how many more exist" in listing.out


async def test_dead_letter_ids_are_checked(redis_url: str, redis: Redis) -> None:
    app = "tests.apps.failing:app"
    dead = "__dead:{failing.jobs.handle}"
    first = await redis.xadd(dead, {"dl.reason": "error", "data": "{}"})
    for _ in range(4):
        await redis.xadd(dead, {"dl.reason": "error", "data": "{}"})

    bogus = await streamkit(
        "deadletters", "purge", app, "handle", "--id", "bogus", "--yes", redis_url=redis_url
    )
    assert bogus.code == 2
    assert "--id 'bogus' is not a dead letter id" in bogus.err
    assert "nothing was purged" in bogus.err
    assert "Invalid stream ID" not in bogus.err

    missing = await streamkit(
        "deadletters",
        "replay",
        app,
        "handle",
        "--id",
        "1-0",
        "--id",
        str(first.decode() if isinstance(first, bytes) else first),
        "--yes",
        redis_url=redis_url,
    )
    assert missing.code == 2
    assert "handle has no dead letter 1-0" in missing.err
    assert "nothing was replayed" in missing.err
    assert await redis.xlen(dead) == 5

    listed = await streamkit(
        "deadletters", "list", app, "handle", "--limit", "2", redis_url=redis_url
    )
    assert listed.code == 0, listed.err
    assert "showing the oldest 2 of 5 dead letters; pass --limit 5 to see them all" in listed.out


@pytest.mark.cluster
async def test_a_mismatch_names_the_delete_stream_command(redis_url: str, redis: Redis) -> None:
    record = (
        '{"order_id": 1, "customer": "ada", "amount": 1.5, "created_at": "2026-01-01T00:00:00Z"}'
    )
    await redis.hset("__meta:{orders_demo.orders}", {"partition_count": "4"})
    refused = await streamkit("send", ORDERS, record, redis_url=redis_url)
    assert refused.code == 2  # configuration: the code disagrees with Redis
    command = "streamkit delete-stream examples.orders.app:orders"
    assert command in refused.err
    assert_no_traceback(refused)
    await redis.xadd("__strm:{orders_demo.orders.3}", {"data": "{}"})
    await redis.xadd("__strm:{orders_demo.unrelated.3}", {"data": "{}"})
    deleted = await streamkit(*command.split()[1:], "--yes", redis_url=redis_url)
    assert deleted.code == 0, deleted.err
    assert "deleted orders_demo.orders (1 event(s))" in deleted.out
    assert await redis.exists(["__strm:{orders_demo.unrelated.3}"]) == 1
    sent = await streamkit("send", ORDERS, record, redis_url=redis_url)
    assert sent.code == 0, sent.err


#: Every command that takes --redis-url, with arguments that are otherwise fine.
URL_COMMANDS: dict[str, list[str]] = {
    "send": ["send", ORDERS, "{}"],
    "sendmany": ["sendmany", ORDERS, "-"],
    "read": ["read", ORDERS],
    "read --follow": ["read", ORDERS, "--follow"],
    "tail": ["tail", ORDERS],
    "tail --follow": ["tail", ORDERS, "--follow"],
    "worker": ["worker", "tests.apps.failing:app"],
    "worker --processes": ["worker", "tests.apps.failing:app", "--processes", "2"],
    "status": ["status", "tests.apps.failing:app"],
    "status --watch": ["status", "tests.apps.failing:app", "--watch"],
    "dashboard": ["dashboard", "tests.apps.failing:app", "--port", "0"],
    "reset": ["reset", "tests.apps.failing:app", "handle", "--to", "start", "--yes"],
    "resume": ["resume", "tests.apps.failing:app", "handle"],
    "delete-stream": ["delete-stream", ORDERS, "--yes"],
    "deadletters list": ["deadletters", "list", "tests.apps.failing:app", "handle"],
    "deadletters replay": ["deadletters", "replay", "tests.apps.failing:app", "handle"],
    "deadletters purge": ["deadletters", "purge", "tests.apps.failing:app", "handle"],
    "jobs info": ["jobs", "info", "tests.apps.jobbing:app"],
    "jobs show": ["jobs", "show", "--queue", "q", "some-id"],
    "jobs abort": ["jobs", "abort", "tests.apps.jobbing:app", "some-id"],
    "jobs events": ["jobs", "events", "tests.apps.jobbing:app"],
    "jobs dlq list": ["jobs", "dlq", "list", "--queue", "q"],
    "jobs dlq replay": ["jobs", "dlq", "replay", "tests.apps.jobbing:app", "--yes"],
    "jobs dlq purge": ["jobs", "dlq", "purge", "--queue", "q", "--yes"],
    "jobs pause": ["jobs", "pause", "tests.apps.jobbing:app", "--job", "add"],
    "jobs resume": ["jobs", "resume", "--queue", "q"],
    "jobs schedules list": ["jobs", "schedules", "list", "tests.apps.jobbing:app"],
    "jobs schedules set": [
        "jobs",
        "schedules",
        "set",
        "tests.apps.jobbing:app",
        "s",
        "add",
        "* * * * *",
    ],
    "jobs schedules remove": ["jobs", "schedules", "remove", "--queue", "q", "s"],
    "table get": ["table", "get", "tests.apps.stateful:app", "counts", "k1"],
    "table list": ["table", "list", "tests.apps.stateful:app", "counts"],
}


def commands_with_a_url_option() -> set[str]:
    from streamkit._cli import cli

    found: set[str] = set()
    pending: list[tuple[str, click.Command]] = [("", cli)]
    while pending:
        prefix, command = pending.pop()
        if isinstance(command, click.Group):
            pending += [(f"{prefix} {n}".strip(), c) for n, c in command.commands.items()]
        elif any(param.name == "redis_url" for param in command.params):
            found.add(prefix)
    return found


def test_every_command_with_a_url_is_tested() -> None:
    assert commands_with_a_url_option() == {name.split(" --")[0] for name in URL_COMMANDS}


def every_command() -> dict[str, click.Command]:
    from streamkit._cli import cli

    found: dict[str, click.Command] = {}
    pending: list[tuple[str, click.Command]] = [("", cli)]
    while pending:
        prefix, command = pending.pop()
        if isinstance(command, click.Group):
            pending += [(f"{prefix} {n}".strip(), c) for n, c in command.commands.items()]
        else:
            found[prefix] = command
    return found


#: The options that count something (entries, keys, records, workers, shards).
COUNT_OPTIONS = {
    "--limit",
    "--count",
    "--lines",
    "--chunk-size",
    "--concurrency",
    "--processes",
    "--shards",
}


def test_every_count_and_limit_is_at_least_1_but_tail_lines() -> None:
    counts = {
        (name, param.opts[0]): param.type
        for name, command in every_command().items()
        for param in command.params
        if isinstance(param, click.Option) and set(param.opts) & (COUNT_OPTIONS | {"-n"})
    }
    assert ("table list", "--limit") in counts
    assert ("read", "--count") in counts
    ranges = {where: (t.min, t.max) for where, t in counts.items() if isinstance(t, click.IntRange)}
    # tail -n 0 --follow prints only the new entries, as tail does.
    assert ranges.pop(("tail", "-n")) == (0, None)
    assert set(ranges) == set(counts) - {("tail", "-n")}, "a count that is no IntRange"
    assert set(ranges.values()) == {(1, None)}, ranges


@pytest.mark.parametrize("limit", ["0", "-1"])
@pytest.mark.parametrize(
    "args",
    [
        ["table", "list", "tests.apps.stateful:app", "counts", "--limit"],
        ["deadletters", "list", "tests.apps.stateful:app", "count", "--limit"],
        ["jobs", "dlq", "list", "tests.apps.jobbing:app", "--limit"],
        ["read", "tests.apps.readable:notes", "--count"],
        ["tail", "tests.apps.readable:notes", "-n"],
    ],
    ids=lambda args: " ".join(a for a in args if ":" not in a),
)
async def test_a_count_below_its_least_is_refused_with_exit_code_2(
    redis_url: str, args: list[str], limit: str
) -> None:
    if args[0] == "tail" and limit == "0":
        return  # allowed (see above)
    result = await streamkit(*args, limit, redis_url=redis_url)
    assert result.code == 2, (result.out, result.err)
    assert result.out == ""
    assert f"{limit} is not in the range" in result.err, result.err
    assert_no_traceback(result)


@pytest.mark.parametrize("url", ["127.0.0.1:6379", "redis://[::1", "http://localhost"])
@pytest.mark.parametrize("args", URL_COMMANDS.values(), ids=list(URL_COMMANDS))
async def test_a_bad_url_is_one_line_and_exit_code_2(args: list[str], url: str) -> None:
    result = await run_in(ROOT, *args, "--redis-url", url, env={})
    assert result.code == 2, (result.out, result.err)
    assert_no_traceback(result)
    assert result.err.startswith(f"Error: --redis-url: '{url}'"), result.err
    assert result.err.count("\n") == 1, result.err
    assert result.out == ""


@pytest.mark.parametrize(
    "args",
    [
        ["status", "tests.apps.failing:app"],
        ["jobs", "info", "--queue", "q"],
        ["jobs", "dlq", "list", "tests.apps.jobbing:app"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
async def test_a_bad_url_in_the_environment_is_one_line(args: list[str]) -> None:
    result = await run_in(ROOT, *args, env={"STREAMKIT_REDIS_URL": "127.0.0.1:6379"})
    assert result.code == 2, (result.out, result.err)
    assert_no_traceback(result)
    assert "STREAMKIT_REDIS_URL: '127.0.0.1:6379' is not a URL" in result.err
    assert result.err.count("\n") == 1, result.err


#: The commands that run for as long as they are let: they ride out an outage.
LONG_RUNNING = {
    "worker",
    "worker --processes",
    "status --watch",
    "dashboard",
    "read --follow",
    "tail --follow",
}


def _closed_port_url() -> str:
    return f"redis://127.0.0.1:{free_port()}"


#: A record of examples.orders.app's, for send (and, on standard input, sendmany).
_ORDER = '{"order_id": 1, "customer": "c", "amount": 1.0, "created_at": "2026-01-01T00:00:00Z"}'


#: One-shot commands of each way of loading what they act on (an app, a stream, a
#: queue by name): the give-up is set where they are loaded, for every command.
ONE_SHOT = ["status", "send", "sendmany", "table get", "jobs info", "jobs dlq list", "tail"]


@pytest.mark.parametrize(
    "args",
    [[_ORDER if arg == "{}" else arg for arg in URL_COMMANDS[name]] for name in ONE_SHOT],
    ids=ONE_SHOT,
)
async def test_a_one_shot_command_gives_up_on_an_unreachable_redis_soon(args: list[str]) -> None:
    """A one-shot command was asked a question: it retries an unreachable Redis for
    ``command_give_up_after`` seconds (here 0: one attempt), not for a worker's
    ``connect_give_up_after`` (30 s by default), then says so in one line."""
    result = await run_in(
        ROOT,
        *args,
        "--redis-url",
        _closed_port_url(),
        env={"STREAMKIT_CONNECT_GIVE_UP_AFTER": "30", "STREAMKIT_COMMAND_GIVE_UP_AFTER": "0"},
        stdin=_ORDER.encode() + b"\n",
    )
    assert result.code == 1, (result.out, result.err)
    assert_no_traceback(result)
    # One attempt, no "retrying ... for up to 30s" first: the error comes first (send
    # and sendmany then say what was sent).
    error = result.err.splitlines()[0]
    assert "retrying" not in result.err, result.err
    assert error.startswith("Error: Redis at redis://127.0.0.1:"), result.err
    assert "is unavailable" in error, result.err


async def test_by_default_a_one_shot_command_gives_up_after_about_3_seconds() -> None:
    result = await run_in(
        ROOT,
        "status",
        "tests.apps.failing:app",
        "--redis-url",
        _closed_port_url(),
        env={"STREAMKIT_CONNECT_GIVE_UP_AFTER": "30"},
    )
    assert result.code == 1, (result.out, result.err)
    found = re.search(r"gave up after (\d+) attempts in ([\d.]+)s", result.err)
    assert found is not None, result.err
    # 3 seconds of retries (not the worker's 30): generous bounds for a loaded machine.
    assert int(found[1]) > 1
    assert 2.5 <= float(found[2]) < 15, result.err


async def test_a_worker_keeps_its_patience() -> None:
    """The worker rides out an outage for connect_give_up_after, whatever the
    commands' setting."""
    result = await run_in(
        ROOT,
        "worker",
        "tests.apps.failing:app",
        "--redis-url",
        _closed_port_url(),
        env={"STREAMKIT_CONNECT_GIVE_UP_AFTER": "1", "STREAMKIT_COMMAND_GIVE_UP_AFTER": "0"},
    )
    assert result.code == 1, (result.out, result.err)
    found = re.search(r"gave up after (\d+) attempts in ([\d.]+)s", result.err)
    assert found is not None, result.err
    assert int(found[1]) > 1, result.err
    assert float(found[2]) >= 1.0, result.err
