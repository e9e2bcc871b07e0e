"""``streamkit read`` and ``tail``: a stream's entries, partitions merged in id order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import pytest
import trio

from streamkit import App, partition_for
from streamkit.testing import free_port, wait_until
from tests.apps.readable import Note
from tests.test_cli import ROOT, assert_no_traceback, read_into, streamkit

if TYPE_CHECKING:
    from streamkit import Redis
    from streamkit.testing import RedisServer

NOTES = "tests.apps.readable:notes"
#: An app with tables, written or not (tests/test_cli_tables.py fills them).
APP = "tests.apps.stateful:app"


async def send_notes(redis_url: str, count: int) -> tuple[App, list[str]]:
    """``count`` notes, over 5 keys (so every partition gets some), one call each:
    their entry ids grow in the order sent."""
    app = App("readable", redis_url=redis_url)
    notes = app.stream("notes", record=Note, partition_by="key", partition_count=4)
    ids = []
    async with app:
        for n in range(count):
            ids += await notes.send(Note(key=f"k{n % 5}", n=n))
    return app, ids


def order(entry_id: str) -> tuple[int, int]:
    millis, seq = entry_id.split("-")
    return int(millis), int(seq)


def lines(out: str) -> list[list[str]]:
    return [line.split("\t") for line in out.splitlines()]


async def test_read_merges_the_partitions_in_the_order_redis_added_the_entries(
    redis_url: str, redis: Redis
) -> None:
    _, ids = await send_notes(redis_url, 12)
    result = await streamkit("read", NOTES, redis_url=redis_url)
    assert result.code == 0, result.err
    rows = lines(result.out)
    # In the order of the ids (each partition is a stream of its own: two entries
    # added in the same millisecond to two partitions have the same id, and go in
    # partition order).
    assert [row[1] for row in rows] == sorted(ids, key=order)
    assert [(order(row[1]), int(row[0])) for row in rows] == sorted(
        (order(row[1]), int(row[0])) for row in rows
    )
    records = [orjson.loads(row[2]) for row in rows]
    assert sorted(r["n"] for r in records) == list(range(12))
    assert all(
        int(row[0]) == partition_for(r["key"], 4) for row, r in zip(rows, records, strict=True)
    )
    assert len({row[0] for row in rows}) > 1  # several partitions, merged

    # JSON lines, a range by id, a count.
    as_json = await streamkit(
        "read", NOTES, "--json", "--from", ids[3], "--count", "4", redis_url=redis_url
    )
    documents = [orjson.loads(line) for line in as_json.out.splitlines()]
    in_order = sorted(ids, key=order)
    # From an id on (the entries of the same id in other partitions too).
    assert len(documents) == 4
    assert all(order(d["id"]) >= order(ids[3]) for d in documents)
    assert [d["id"] for d in documents] == sorted((d["id"] for d in documents), key=order)
    assert all(d["partition"] == partition_for(d["record"]["key"], 4) for d in documents)
    assert set(documents[0]["record"]) == {"key", "n", "text"}
    until = await streamkit("read", NOTES, "--to", in_order[1], redis_url=redis_url)
    assert all(order(row[1]) <= order(in_order[1]) for row in lines(until.out))
    assert len(lines(until.out)) >= 2
    # From a time: nothing sent after the year 2100; everything after 2000.
    assert (await streamkit("read", NOTES, "--from", "2100-01-01", redis_url=redis_url)).out == ""
    since = await streamkit("read", NOTES, "--from", "2000-01-01T00:00:00Z", redis_url=redis_url)
    assert len(lines(since.out)) == 12

    # One partition; one key (its partition, and only its records).
    one = await streamkit("read", NOTES, "--partition", "0", redis_url=redis_url)
    assert {row[0] for row in lines(one.out)} == {"0"}
    keyed = await streamkit("read", NOTES, "--key", "k2", "--json", redis_url=redis_url)
    assert [orjson.loads(line)["record"]["n"] for line in keyed.out.splitlines()] == [2, 7]


async def test_what_does_not_decode_is_said_and_text_from_redis_is_escaped(
    redis_url: str, redis: Redis
) -> None:
    app, _ = await send_notes(redis_url, 1)
    notes = app.streams["notes"]
    async with app:
        await notes.send(Note(key="k1", n=1, text="\u202eevil\x1b[2J"))
    await redis.xadd(notes.key(2), {"data": '{"key": "k9"}'})
    await redis.xadd(notes.key(3), {"\x1b[31mname": "\x1b[31mvalue"})
    for args in ((), ("--json",)):
        result = await streamkit("read", NOTES, *args, redis_url=redis_url)
        assert result.code == 0, result.err
        assert "\x1b" not in result.out
        assert "\u202e" not in result.out
        assert "\\u202eevil" in result.out
    # Entries of two partitions in the same millisecond may come in either order, so
    # the undecodable ones are found as the last row of their partition, not by line.
    text = {row[0]: row for row in lines((await streamkit("read", NOTES, redis_url=redis_url)).out)}
    assert text["2"][2].startswith("undecodable: required field missing @ $.n")
    assert text["3"][2].startswith("undecodable: no b'data'")
    as_json = await streamkit("read", NOTES, "--json", redis_url=redis_url)
    documents = [orjson.loads(line) for line in as_json.out.splitlines()]
    [bad] = [d for d in documents if d.get("partition") == 3 and "undecodable" in d]
    assert bad["fields"] == {"\x1b[31mname": "\x1b[31mvalue"}  # escaped on the way, as JSON
    assert bad["undecodable"].startswith("no b'data'")


async def test_tail_shows_the_last_entries_then_follows_until_ctrl_c(
    redis_url: str, redis: Redis
) -> None:
    app, ids = await send_notes(redis_url, 8)
    result = await streamkit("tail", NOTES, "-n", "3", redis_url=redis_url)
    assert [row[1] for row in lines(result.out)] == sorted(ids, key=order)[-3:]
    keyed = await streamkit("tail", NOTES, "-n", "1", "--key", "k1", redis_url=redis_url)
    assert [orjson.loads(row[2])["n"] for row in lines(keyed.out)] == [6]

    env = {**os.environ, "STREAMKIT_REDIS_URL": redis_url}
    out, err = bytearray(), bytearray()
    notes = app.streams["notes"]
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "streamkit", "tail", NOTES, "-n", "1", "--follow", "--json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_into, process.stdout, out)
                nursery.start_soon(read_into, process.stderr, err)
                await wait_until(lambda: out.count(b"\n") == 1, what="the last note", within=20)
                async with app:
                    sent = await notes.send(Note(key="k0", n=100))
                    sent += await notes.send(Note(key="k3", n=101))
                await wait_until(lambda: out.count(b"\n") == 3, what="the new notes", within=20)
                process.send_signal(signal.SIGINT)
                assert await process.wait() == 0, err.decode()
        finally:
            if process.returncode is None:
                process.kill()
    shown = [orjson.loads(line) for line in out.splitlines()]
    assert shown[0]["id"] == sorted(ids, key=order)[-1]
    assert sorted(d["id"] for d in shown[1:]) == sorted(sent)
    assert sorted(d["record"]["n"] for d in shown[1:]) == [100, 101]


async def test_an_output_stream_is_read_by_its_name(redis_url: str, redis: Redis) -> None:
    """A stream made where it is used (a window's output) has no module attribute."""
    app = App("readable", redis_url=redis_url)
    digests = app.stream("digests", record=dict, partition_by=lambda r: r["key"], partition_count=2)
    async with app:
        await digests.send({"key": "a", "total": 3})
    result = await streamkit("read", "tests.apps.readable:digests", "--json", redis_url=redis_url)
    assert result.code == 0, result.err
    assert orjson.loads(result.out)["record"] == {"key": "a", "total": 3}


async def test_a_reader_gone_ends_the_command_quietly(redis_url: str) -> None:
    # (`streamkit read ... | head`: the pipe's reader gone, each write fails with EPIPE,
    # which the command takes for its end, not for a lost connection to Redis.)
    await send_notes(redis_url, 3)
    env = {**os.environ, "STREAMKIT_REDIS_URL": redis_url}
    for args in (
        ["read", NOTES],
        ["tail", NOTES, "--json"],
        ["table", "list", APP, "counts"],
        ["status", APP, "--watch", "--json", "--interval", "0.2"],
    ):
        reader, writer = os.pipe()
        os.close(reader)
        try:
            with trio.fail_after(60):
                done = await trio.run_process(
                    [sys.executable, "-m", "streamkit", *args],
                    cwd=ROOT,
                    env=env,
                    stdout=writer,
                    capture_stderr=True,
                    check=False,
                )
        finally:
            os.close(writer)
        assert (done.returncode, done.stderr) == (0, b""), (args, done.stderr)


async def test_mistakes_are_one_line(redis_url: str) -> None:
    cases: list[tuple[list[str], str]] = [
        (["read", NOTES, "--from", "yesterday"], "--from/--to: 'yesterday' is not start"),
        (["read", NOTES, "--partition", "4"], "--partition must be 0..3"),
        (["read", NOTES, "--partition", "1", "--key", "k"], "give --partition or --key"),
        (["read", NOTES, "--follow", "--count", "2"], "--follow reads on past the end"),
        (["tail", "tests.apps.readable:nothing"], "has no attribute 'nothing'"),
        (["tail", "tests.apps.readable:app"], "tests.apps.readable:app is an App, not a stream"),
        (["tail", NOTES, "--key", "k", "--partition", "1"], "give --partition or --key"),
    ]
    for args, message in cases:
        result: Any = await streamkit(*args, redis_url=redis_url)
        assert result.code == 2, (args, result.err)
        assert message in result.err, (args, result.err)
        assert result.err.count("\n") == 1, result.err
        assert_no_traceback(result)


async def test_follow_commands_ride_out_a_redis_restart(
    private_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tail -f`` and ``jobs events --follow`` go on through a Redis restart, saying
    once that Redis is unreachable and once that it is back, and show what came after;
    reads are safe to send again, so a lost reply is not an "outcome unknown"."""
    from tests.apps.jobbing import add, app as jobbing

    url = private_redis.url
    app, _ = await send_notes(url, 2)
    notes = app.streams["notes"]
    monkeypatch.setattr(jobbing, "settings", attrs.evolve(jobbing.settings, redis_url=url))
    async with jobbing:
        await add.delay(1, 2)
    env = {**os.environ, "STREAMKIT_REDIS_URL": url}
    # Each shows one line first (the last note, the first job's event): then it follows.
    commands = {
        "tail": ["tail", NOTES, "-n", "1", "--follow", "--json"],
        "events": ["jobs", "events", "tests.apps.jobbing:app", "--follow", "--json"],
    }
    outputs = {name: (bytearray(), bytearray()) for name in commands}
    with trio.fail_after(90):
        processes = {
            name: await trio.lowlevel.open_process(
                [sys.executable, "-m", "streamkit", *args],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for name, args in commands.items()
        }
        try:
            async with trio.open_nursery() as nursery:
                for name, process in processes.items():
                    nursery.start_soon(read_into, process.stdout, outputs[name][0])
                    nursery.start_soon(read_into, process.stderr, outputs[name][1])
                for name, (out, _) in outputs.items():
                    await wait_until(lambda o=out: o.count(b"\n") == 1, what=name, within=30)  # type: ignore[misc]
                await trio.to_thread.run_sync(private_redis.stop)
                for name, (_, err) in outputs.items():
                    await wait_until(lambda e=err: b"unreachable" in e, what=name, within=20)  # type: ignore[misc]
                await trio.sleep(1)  # down a while: every follower retries
                await trio.to_thread.run_sync(private_redis.start)
                async with app:
                    await notes.send(Note(key="k1", n=11))
                async with jobbing:
                    await add.delay(3, 4)
                for name, (out, err) in outputs.items():
                    await wait_until(lambda o=out: o.count(b"\n") == 2, what=name, within=30)  # type: ignore[misc]
                    await wait_until(lambda e=err: b"back after" in e, what=name, within=20)  # type: ignore[misc]
                for process in processes.values():
                    process.send_signal(signal.SIGINT)
                for name, process in processes.items():
                    assert await process.wait() == 0, outputs[name][1].decode()
        finally:
            for process in processes.values():
                if process.returncode is None:
                    process.kill()
    for name, (_, err) in outputs.items():
        said = err.decode()
        assert said.count("unreachable") == 1, (name, said)
        assert said.count("back after") == 1, (name, said)
        assert "Traceback" not in said, (name, said)
        assert "may or may not have run" not in said, (name, said)
    tailed = [orjson.loads(line)["record"]["n"] for line in outputs["tail"][0].splitlines()]
    assert tailed == [1, 11]
    kinds = [orjson.loads(line)["kind"] for line in outputs["events"][0].splitlines()]
    assert kinds == ["enqueued", "enqueued"]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize(
    "command",
    [
        ["tail", NOTES, "--follow"],
        ["read", NOTES, "--follow"],
        ["jobs", "events", "tests.apps.jobbing:app", "--follow"],
    ],
)
async def test_a_follow_stopped_while_redis_is_unreachable_ends_cleanly(
    command: list[str], stop: signal.Signals
) -> None:
    """Stopped while it waits for a Redis that is not there yet: exit code 0, the
    waiting said in one line, no traceback."""
    env = {**os.environ, "STREAMKIT_REDIS_URL": f"redis://127.0.0.1:{free_port()}"}
    err = bytearray()
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "streamkit", *command],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_into, process.stderr, err)
                await wait_until(lambda: b"unreachable" in err, what="the waiting", within=30)
                await trio.sleep(0.5)
                process.send_signal(stop)
                assert await process.wait() == 0, err.decode()
        finally:
            if process.returncode is None:
                process.kill()
    assert "Traceback" not in err.decode(), err.decode()
    assert err.decode().count("\n") == 1, err.decode()


async def test_a_stream_recorded_with_more_partitions_is_refused_not_shown_in_part(
    redis_url: str,
) -> None:
    # The notes stream recorded with 6 partitions, the code saying 4: read, tail and a
    # worker refuse it (exit code 2: configuration, which a supervisor does not restart)
    # rather than hide partitions 4 and 5, as send does.
    other = App("readable", redis_url=redis_url)
    wider = other.stream("notes", record=Note, partition_by="key", partition_count=6)
    async with other:
        await wider.send(Note(key="k", n=1))
    for command in (("read", NOTES), ("tail", NOTES), ("send", NOTES, '{"key": "k", "n": 2}')):
        result = await streamkit(*command, redis_url=redis_url)
        assert result.code == 2, (command, result.err)
        assert "was created with partition_count=6" in result.err, command
        assert_no_traceback(result)
    narrow = App("narrow", redis_url=redis_url)
    wide = narrow.stream("ticks", record=dict, partition_by=lambda r: r["n"], partition_count=6)
    async with narrow:
        await wide.check_metadata()
    worker = await streamkit("worker", "tests.apps.narrow:app", redis_url=redis_url)
    assert worker.code == 2, worker.err
    assert "was created with partition_count=6" in worker.err
