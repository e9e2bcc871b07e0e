"""The Redis scripts' loader (streamkit._lua) and the scripts' files."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

import pytest

from streamkit import _lua

if TYPE_CHECKING:
    from pathlib import Path

#: Each script's SHA1 as assembled: a change to a script's text (or to what it includes)
#: shows here, and is made on purpose by updating its pin.
PINS = {
    "admin/reset": "65b897ce193adbd93cc47bb6fdb91616067737f6",
    "commit/ack": "010ff87c25ebede2ef2355e71abb156be209c6f4",
    "commit/read": "3a069caef6bbf33df90a79d028af536972562af9",
    "commit/woken_read": "5b77dcbdf8aba02a59061c49ec713326a59642d6",
    "jobs/abort": "b00e0d87ca81ecef636d25405c1e5a5441ec709d",
    "jobs/claim": "ce1fa9e268af8ef9b21fe12b8e1537f72f211200",
    "jobs/control": "ebb3ed901cd1ad124ea82ee44021a6a1885cb00f",
    "jobs/counts": "56ba7336841609e60dc8610f315f17f502234995",
    "jobs/deliver": "7fc1d4623531c65611a54e36085869d59e9a42a5",
    "jobs/delivered": "91f6ea0289ceec2c9656d3f3e042ab2424931243",
    "jobs/enqueue": "59c68f633251701849e569a5af4c928bfe902fea",
    "jobs/finish": "c3d4bff21d9c8941cea429a6c96e59e14b439acf",
    "jobs/link": "874b9a02c1753048a5ad46ebaedd46ce635104ac",
    "jobs/progress": "ce8d709b606bd347fceb100453d7f983643704ca",
    "jobs/purge": "661bbd57edcdd235323d3b3c2a16b2c2011e58a9",
    "jobs/recover": "53f49e9cd2edca20e220ae8cfbcac3e151bdc9a4",
    "jobs/renew": "c5ed479a13f86f5e8c38a9ad6c4dace55b34d1a5",
    "jobs/replay": "d568b59d2e0d2dbf741865428875cd980844a5e7",
    "jobs/schedule": "2c0989aa11b6b7bd71842a78d4b4747337f7499a",
    "jobs/settle": "0450f06580d7f11a6d53009df7ddd210981f1a99",
    "jobs/watch": "a5e315128ac18b7ffaca200ebe5856fbd347b5bb",
    "locks/acquire": "1ffa1b69f709ecc31c7d7fbcbc9ad81dbe1a34fc",
    "locks/extend": "1451f7dd00c1bb52a8b42d200dbe2dfb239e3029",
    "locks/inspect": "4c1c5320cc80a8bc64d2a333841f5eefa0b0c808",
    "locks/release": "916f618acf6cc07353371188389edef2796f4a02",
    "membership/heartbeat": "0c4d497e72c96b1df1d0aae4845e1ed4fd19491a",
    "spark/ids": "dae4979cfcf0d38a89abfa0926ba365690e5ec0a",
    "spark/write": "08e545622e7ace14b90237e737c9099453136833",
    "streams/append": "242516d6417b24a806069084d93b8024106f1124",
    "streams/metadata": "a28ef5fd0daf55e4dccd016c7f7e13eb9f8aaaee",
    "streams/outbox_delete": "ee8b96c3e8d3401f066cbfa875e8ab9594e90906",
    "streams/outbox_read": "440b0aa9a46c302270ff24407d12e9e467be0c35",
    "streams/relay": "c9211140661dd0bde0f1a47afab7cccbe63cf730",
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
