"""The Redis scripts' loader (streamkit._lua) and the scripts' files."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from streamkit import _keys, _lua
from streamkit._produce import marker_key
from streamkit._redis._slots import key_slot
from streamkit.jobs._layout import ShardKeys
from streamkit.jobs._plan import OPTION_KEYS
from tests import luacheck

#: Each script's SHA1 as assembled: a change to a script's text (or to what it includes)
#: shows here, and is made on purpose by updating its pin.
PINS = {
    "admin/reset": "9d7333b23c8d459cfa8f4f633d713822d3e8edc2",
    "commit/ack": "f164d3dd291193fd0c30067da6a06852f9757382",
    "commit/permit": "9774f181c38dd56b8b5b81317a031cd5dafa2645",
    "commit/read": "da3d8598b778afd24fd16c30872d4d7f401f6540",
    "commit/woken_read": "c9ff584b2c48ebdf2840fd13a465fa46448c2307",
    "jobs/abort": "b41721240bf550358810377e56467a59b80eb6c4",
    "jobs/claim": "49e85239d13e5394fcbfaf2c8a60af04c087c5b6",
    "jobs/control": "c03b873fe78e53bd391b636f1f2d0a733023f005",
    "jobs/counts": "d1a349e1c16ebfa21a44e0bddbc0706c3b5c1972",
    "jobs/deliver": "dc8cdc0eb44a84f5ec322df442ac62f963dd8615",
    "jobs/delivered": "5097b575ac3133876ca797e3c93bd232666c4466",
    "jobs/enqueue": "f1b1e65af01bf9d4fdde5001578576450738237b",
    "jobs/finish": "77427b5521d60d592b65a6487413ec2201676e14",
    "jobs/link": "1e8856aed2d54d3a14520295ab7fdb01951323ca",
    "jobs/progress": "90d3e6a58bfb8ea66ccf3272389d5af673a6cc0d",
    "jobs/purge": "83db6065520e5ca7ee311b3ffebcea94c4e3280d",
    "jobs/recover": "991283f5adc65acf671ae496999c713f44c0bbee",
    "jobs/renew": "7dcd477d0dfc2f99cf9d23ea0475d0cfe2a9de30",
    "jobs/replay": "399f0015c352d3262e50c405fd78f4ffedc6f556",
    "jobs/schedule": "d50484ee229c2ca9e9c0258e44aca52ab55713f1",
    "jobs/settle": "3323ded4d0fec2e5201a4e1796a4ebf37d767be3",
    "jobs/stream": "2338129478ccd70cdaf05f32c78f9c5958228d79",
    "jobs/watch": "3eadd0c22ed3e93b74b58ff0e67beefe101f6f7e",
    "locks/acquire": "1ffa1b69f709ecc31c7d7fbcbc9ad81dbe1a34fc",
    "locks/extend": "1451f7dd00c1bb52a8b42d200dbe2dfb239e3029",
    "locks/extend_many": "5683f2727b7ee7db7a66ee1eb7ec404962aa65f3",
    "locks/inspect": "4c1c5320cc80a8bc64d2a333841f5eefa0b0c808",
    "locks/release": "916f618acf6cc07353371188389edef2796f4a02",
    "membership/heartbeat": "809cd2060fcfd0eb708ab0c2fed8fdae35808da2",
    "spark/ids": "dae4979cfcf0d38a89abfa0926ba365690e5ec0a",
    "spark/write": "bb37580a2dd51ec2a0ab81eaf6e6d0da66d883be",
    "streams/append": "b4a7415def3b2fa3a7471e909e1a437af65beebe",
    "streams/caught_up": "4d31d35f6290a5c4d4d14c77675598673623256e",
    "streams/metadata": "a28ef5fd0daf55e4dccd016c7f7e13eb9f8aaaee",
    "streams/outbox_delete": "ee8b96c3e8d3401f066cbfa875e8ab9594e90906",
    "streams/outbox_read": "440b0aa9a46c302270ff24407d12e9e467be0c35",
    "streams/relay": "af22d3d4e459b535d8c115d16db4d374f41096c4",
    "streams/undelivered": "20856271f494422213154727e1a9da88932b3c30",
    "tables/due": "00fcef705595790f0dc93879fa437bbd1b3949fe",
    "tables/read": "68f4f57f1bf8bfcd5e1498c0b99b5fac41379561",
    "tables/scan": "cbaeeecf49183416c908998be86910b4c71d9d1d",
}


def test_every_script_is_pinned() -> None:
    assert _lua.names() == sorted(PINS)


def test_each_assembled_script_has_its_pinned_digest() -> None:
    changed = {
        name: _lua.script(name).sha for name in _lua.names() if _lua.script(name).sha != PINS[name]
    }
    assert changed == {}, "a script's text changed: if on purpose, update its pin"
    for name in _lua.names():
        text = _lua.script(name).text
        assert _lua.script(name).sha == hashlib.sha1(text.encode()).hexdigest()


def test_every_caller_gets_the_same_script_object() -> None:
    assert _lua.script("commit/read") is _lua.script("commit/read")
    read = _lua.script("commit/read")
    assert _lua.by_sha(read.sha) is read


# ------------------------------------------------------------------ the loader


HEADER = (
    "-- A script.\n--\n-- KEYS: stream, lock\n-- TAG: {partition}\n-- ARGV: lease\n-- REPLY: int\n"
)


def library(tmp_path: Path, files: dict[str, str], **constants: int | str) -> _lua.Library:
    for name, text in files.items():
        path = tmp_path / f"{name}.lua"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _lua.Library(tmp_path, constants)


def test_includes_are_resolved_once_each_nested_and_in_order(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        {
            "lib/a": "-- Piece a.\n--#include lib/b\nlocal function a() return b() end\n",
            "lib/b": "-- Piece b.\nlocal function b() return 1 end\n",
            "x/run": HEADER + "--#include lib/b\n--#include lib/a\n--#include lib/a\nreturn a()\n",
        },
    )
    script = lib.script("x/run")
    assert script.text == (
        "local function b() return 1 end\nlocal function a() return b() end\nreturn a()\n"
    )
    assert script.origins == (("lib/b.lua", 2), ("lib/a.lua", 3), ("x/run.lua", 10))
    assert script.origin(2) == ("lib/a.lua", 3)
    assert lib.names() == ["x/run"]


def test_a_cycle_of_includes_is_refused_naming_it(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        {
            "lib/a": "-- a\n--#include lib/b\n",
            "lib/b": "-- b\n\n--#include lib/a\n",
            "x/run": HEADER + "--#include lib/a\n",
        },
    )
    with pytest.raises(_lua.LuaSourceError, match=r"lib/b\.lua:3: includes lib/a again, a cycle: "):
        lib.script("x/run")
    with pytest.raises(_lua.LuaSourceError, match=r"lib/a -> lib/b -> lib/a"):
        lib.script("x/run")


def test_an_unknown_include_is_refused_naming_the_line(tmp_path: Path) -> None:
    lib = library(tmp_path, {"x/run": HEADER + "return 1\n--#include lib/nope\n"})
    with pytest.raises(_lua.LuaSourceError, match=r"x/run\.lua:8: there is no lib/nope\.lua"):
        lib.script("x/run")
    lib = library(tmp_path, {"x/two": HEADER + "--#include x/run\n"})
    with pytest.raises(_lua.LuaSourceError, match="not a piece of lib/"):
        lib.script("x/two")
    with pytest.raises(_lua.LuaSourceError, match=r"there is no x/nope\.lua"):
        lib.script("x/nope")
    with pytest.raises(_lua.LuaSourceError, match="a shared piece, not a script"):
        lib.script("lib/a")


def test_the_header_says_the_keys_fixed_or_varying(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        {
            "x/fixed": HEADER + "return 1\n",
            "x/more": HEADER.replace("stream, lock", "stream, lock, written... (note)")
            + "return 1\n",
            "x/pairs": HEADER.replace("stream, lock", "(stream, lock)... (per partition)")
            .replace("{partition}", "none (one server only)")
            .replace("ARGV: lease", "ARGV: group, (lease, seen)...")
            + "return 1\n",
            "x/flags": "-- FLAGS: allow-oom\n-- KEYS: none\n-- ARGV: none\n-- REPLY: ok\n"
            "return 1\n",
        },
    )
    fixed, more, pairs = lib.script("x/fixed"), lib.script("x/more"), lib.script("x/pairs")
    assert (fixed.numkeys, fixed.header and fixed.header.tag) == (2, "partition")
    assert fixed.text == "return 1\n"
    assert more.numkeys is None
    assert more.header is not None
    assert more.header.more_keys == ("written",)
    assert pairs.header is not None
    assert (pairs.header.keys, pairs.header.more_keys, pairs.header.tag) == (
        (),
        ("stream", "lock"),
        None,
    )
    assert (pairs.header.argv, pairs.header.more_argv) == (("group",), ("lease", "seen"))
    flags = lib.script("x/flags")
    assert flags.text == "#!lua flags=allow-oom\nreturn 1\n"
    assert flags.numkeys == 0


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("-- KEYS: a\n-- TAG: {t}\n-- ARGV: none\n", "lacks REPLY"),
        ("-- KEYS: a\n-- ARGV: none\n-- REPLY: int\n", "names their hash TAG"),
        ("-- KEYS: a..., b\n-- TAG: {t}\n-- ARGV: none\n-- REPLY: int\n", "nothing may follow"),
        ("-- KEYS: Stream\n-- TAG: {t}\n-- ARGV: none\n-- REPLY: int\n", "is not a name"),
        ("-- KEYS: none\n-- ARGV: none\n-- REPLY: {int\n", "expected '}'"),
        ("-- KEYS: a\n-- TAG: t\n-- ARGV: none\n-- REPLY: int\n", "a tag is {name}"),
        ("-- KEYS: none\n-- ARGV: none\n-- REPLY: int\n-- after\n", "prose after the header"),
        ("-- KEYS: none\n-- KEYS: none\n-- ARGV: none\n-- REPLY: int\n", "KEYS given twice"),
    ],
)
def test_a_bad_header_is_refused_naming_the_file(tmp_path: Path, header: str, message: str) -> None:
    lib = library(tmp_path, {"x/bad": header + "return 1\n"})
    with pytest.raises(_lua.LuaSourceError, match=r"^x/bad\.lua.*" + re.escape(message)):
        lib.script("x/bad")


def test_constants_are_declared_with_the_names_a_script_reads(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        {
            "lib/p": "-- p\nlocal function step() return K.STEP end\n",
            "x/run": HEADER + "--#include lib/p\nreturn {step(), K.NAME}\n",
            "x/none": HEADER + "return 1\n",
            "x/bad": HEADER + "return K.NOPE\n",
        },
        STEP=50,
        NAME="it's",
        UNUSED=1,
    )
    script = lib.script("x/run")
    assert script.text.startswith("local K = {\n  NAME = 'it\\'s',\n  STEP = 50,\n}\n")
    assert script.origin(1) == (_lua.CONSTANTS_ORIGIN, 0)
    assert script.origin(5) == ("lib/p.lua", 2)
    assert lib.script("x/none").text == "return 1\n"
    with pytest.raises(_lua.LuaSourceError, match=r"x/bad\.lua:7: K\.NOPE is not a constant"):
        lib.script("x/bad")


def test_every_constant_is_read_by_some_script() -> None:
    read = {
        name
        for script in map(_lua.script, _lua.names())
        for name in re.findall(r"\bK\.([A-Z_]+)", script.text)
    }
    assert read == set(_lua.CONSTANTS)


@pytest.mark.parametrize(
    ("shape", "good", "bad"),
    [
        ("int", [3, -1], [b"3", None, True]),
        ("-1 (not ours) | {ids: [str], n: int}", [-1, [[b"a", "b"], 2], [[], 0]], [0, [[1], 2]]),
        ("[0 | -1 | {[str], int | [int]}]", [[], [0, -1, [[], 3], [[b"x"], [1]]]], [[1], [[]]]),
        ("nil | {str, str | nil}", [None, [b"a", None]], [[b"a"], [None, b"b"]]),
        ("ok", [b"OK", "OK", True], [b"KO", 1]),
        ("any", [None, 1, [[]]], []),
    ],
)
def test_a_reply_shape_matches_what_it_says(shape: str, good: list[Any], bad: list[Any]) -> None:
    parsed = _lua.Shape.parse(shape)
    assert all(parsed.matches(reply) for reply in good)
    assert not any(parsed.matches(reply) for reply in bad)


def test_an_inline_script_is_one_object_per_text() -> None:
    one = _lua.inline("return 'inline test'")
    assert _lua.inline("return 'inline test'") is one
    assert one.numkeys is None
    assert one.origin(1) == ("<inline>", 1)
    assert _lua.by_sha(one.sha) is one


# ------------------------------------------------------------------ the scripts' headers

_APP, _STREAM, _PROC, _N = "shop", "orders", "printer", 3
_PARTITION = _keys.stream_key(_APP, _STREAM, _N)
_PARTITION_LOCK = _keys.partition_lock_name(_APP, _STREAM, _PROC, _N)
_OUTBOX = _keys.outbox_key(_APP, _STREAM, _PROC, _N)
_SHARD = ShardKeys("shop.mail", 2)

#: Per hash tag a header names: the tag, and what each key a header names is, built by
#: streamkit's own key layout (a key that may be any of several, all of them).
KEY_EXAMPLES: dict[str, tuple[str, dict[str, list[str]]]] = {
    "partition": (
        "{shop.orders.3}",
        {
            "stream": [_PARTITION],
            "lock": [_keys.lock_key(_PARTITION_LOCK)],
            "fence": [_keys.fence_key(_PARTITION_LOCK)],
            "permit": [_keys.permit_key(_keys.lock_key(_PARTITION_LOCK))],
            # the producer's append marker, and a Spark write's chunk marker
            "marker": [
                marker_key(_PARTITION, "t1"),
                _keys.spark_marker_key(_APP, _STREAM, _N, "w", "b", 0, 1),
            ],
            "finished": [marker_key(_PARTITION, "t0")],
            "state": [
                _keys.state_key(_APP, _STREAM, _PROC, _N),
                _OUTBOX,
                _keys.table_key(_APP, _STREAM, "counts", _N),
                _keys.table_expiry_key(_APP, _STREAM, "counts", _N),
                _keys.windows_key(_APP, _STREAM, "tens", _N),
                _keys.window_key(_APP, _STREAM, "sums", _N),
                _keys.window_index_key(_APP, _STREAM, "sums", _N),
            ],
            "table": [_keys.table_key(_APP, _STREAM, "counts", _N)],
            "expiry": [_keys.table_expiry_key(_APP, _STREAM, "counts", _N)],
            "written": [
                _keys.table_key(_APP, _STREAM, "counts", _N),
                _keys.table_expiry_key(_APP, _STREAM, "counts", _N),
                _keys.windows_key(_APP, _STREAM, "tens", _N),
                _keys.window_values_key(_APP, _STREAM, "tens", _N, 60_000),
                _keys.window_closed_key(_APP, _STREAM, "tens", _N, 60_000),
                _keys.window_key(_APP, _STREAM, "sums", _N),
                _keys.window_index_key(_APP, _STREAM, "sums", _N),
                _keys.state_key(_APP, _STREAM, _PROC, _N),
                _OUTBOX,
            ],
            "outbox": [_OUTBOX],
            "progress": [_OUTBOX + ":relayed"],  # as streamkit._state_relay names it
            "relayed": [_keys.relay_key(_PARTITION, "shop.in.1")],
        },
    ),
    "stream": ("{shop.orders}", {"meta": [_keys.meta_key(_APP, _STREAM)]}),
    "lock": (
        "{jobs-leader}",
        {"lock": [_keys.lock_key("jobs-leader")], "fence": [_keys.fence_key("jobs-leader")]},
    ),
    "group": (
        "{shop.orders.printer}",
        {
            "beat": [_keys.heartbeat_key(_keys.processor_group(_APP, _STREAM, _PROC), "m1")],
            "state": [_keys.membership_key(_keys.processor_group(_APP, _STREAM, _PROC))],
            "watched": [_keys.heartbeat_key(_keys.processor_group(_APP, _STREAM, _PROC), "m2")],
        },
    ),
    "shard": (
        "{shop.mail.2}",
        {
            "ready_high": [_SHARD.ready(0)],
            "ready_normal": [_SHARD.ready(1)],
            "ready_low": [_SHARD.ready(2)],
            "schedule": [_SHARD.schedule],
            "dead": [_SHARD.dead],
            "done": [_SHARD.done],
            "counts": [_SHARD.counts],
        },
    ),
}
#: The scripts whose keys need not share a slot (their header's TAG says why).
UNTAGGED = {"commit/woken_read", "locks/extend_many"}


def tag_problems(script: _lua.Script) -> list[str]:
    """What is wrong with the keys ``script``'s header names: a tag or a key of no known
    kind, or a key not in the tag's slot."""
    header = script.header
    assert header is not None
    if header.tag not in KEY_EXAMPLES:
        return [f"{script.name}: no examples of the tag {{{header.tag}}}"]
    tag, examples = KEY_EXAMPLES[header.tag]
    problems = []
    for key_name in (*header.keys, *header.more_keys):
        if key_name not in examples:
            problems.append(f"{script.name}: what is a {key_name!r} key of {tag}?")
        problems.extend(
            f"{script.name}: {key_name} {key} is not in {tag}'s slot"
            for key in examples.get(key_name, [])
            if _keys.hash_tag_of(key) != tag or key_slot(key) != key_slot(tag)
        )
    return problems


def test_every_scripts_keys_share_the_hash_tag_its_header_names() -> None:
    scripts = [_lua.script(name) for name in _lua.names()]
    assert {s.name for s in scripts if s.header and s.header.tag is None} == UNTAGGED
    problems = [
        p for s in scripts if s.header and s.header.tag is not None for p in tag_problems(s)
    ]
    assert problems == []


def test_keys_of_other_slots_or_unknown_kinds_are_found(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        {
            "x/meta": HEADER.replace("stream, lock", "stream, meta") + "return 1\n",
            "x/what": HEADER.replace("stream, lock", "stream, mystery") + "return 1\n",
            "x/tag": HEADER.replace("{partition}", "{nowhere}") + "return 1\n",
        },
    )
    # The stream's metadata is in the stream's slot, not the partition's.
    KEY_EXAMPLES["partition"][1]["meta"] = KEY_EXAMPLES["stream"][1]["meta"]
    try:
        assert tag_problems(lib.script("x/meta")) == [
            "x/meta: meta __meta:{shop.orders} is not in {shop.orders.3}'s slot"
        ]
    finally:
        del KEY_EXAMPLES["partition"][1]["meta"]
    assert tag_problems(lib.script("x/what")) == [
        "x/what: what is a 'mystery' key of {shop.orders.3}?"
    ]
    assert tag_problems(lib.script("x/tag")) == ["x/tag: no examples of the tag {nowhere}"]


def test_the_job_options_keys_agree_between_python_and_lua() -> None:
    text = (Path(_lua.__file__).parent / "lib/jobs/options.lua").read_text()
    table = dict(re.findall(r"^  (\w+) = '(\w+)',", text, re.MULTILINE))
    assert table == dict(OPTION_KEYS)
    assert len(set(table.values())) == len(table)
    # The enqueue script reads an option only through the table.
    enqueue = _lua.script("jobs/enqueue").text
    assert not re.findall(r"\bo\.\w+", enqueue)
    assert set(re.findall(r"\bOPT\.(\w+)", enqueue)) == set(table)


# ------------------------------------------------------------------ luacheck


def test_luacheck_finds_nothing_in_any_assembled_script() -> None:
    assert luacheck.reports() == []


def test_luacheck_reports_name_the_file_and_line_they_came_from(tmp_path: Path) -> None:
    lib = library(
        tmp_path,
        {
            "lib/p": "-- p\nlocal function unused() return 1 end\nlocal function used() end\n",
            "x/one": HEADER + "--#include lib/p\nused()\nreturn nope\n",
            "x/two": HEADER + "--#include lib/p\nused()\nreturn 2\n",
        },
    )
    assert sorted(luacheck.reports(lib)) == [
        "streamkit/_lua/lib/p.lua:2:16: (W211) unused function 'unused' (in x/one, x/two)",
        "streamkit/_lua/x/one.lua:9:8: (W113) accessing undefined variable 'nope' (in x/one)",
    ]
