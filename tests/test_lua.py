"""The Redis scripts' loader (streamkit._lua) and the scripts' files."""

from __future__ import annotations

import hashlib

from streamkit import _lua

#: Each script's SHA1 as assembled: a change to a script's text (or to what it includes)
#: shows here, and is made on purpose by updating its pin.
PINS = {
    "admin/reset": "65b897ce193adbd93cc47bb6fdb91616067737f6",
    "commit/ack": "edb718c37dedc1e454215f4a283caba4bd35bd35",
    "commit/read": "0777fa40c028fe91c7032e559b36f5e44d197f52",
    "commit/woken_read": "5b77dcbdf8aba02a59061c49ec713326a59642d6",
    "jobs/abort": "dda12ee32902e5313d5e719a37d213d8e9b6fef6",
    "jobs/claim": "be6a00575199ef12e34a543717ca13f412df6f62",
    "jobs/control": "2c2702ee560ab4fe899f90ac65d65456f3632552",
    "jobs/counts": "540f10b90ae6b3d5cdd25e510ee0e7396695e5f8",
    "jobs/deliver": "9b14fd0330eb1e5b69ce23ae260726d9bf86ef94",
    "jobs/delivered": "a74363716cd89319edb0916063c31c48ad8cf3c6",
    "jobs/enqueue": "fd8526efd38393d52493e9c2519a3b67e3b4f641",
    "jobs/finish": "ddea63866a6a13e357bfb45e4c92e45d034bbd32",
    "jobs/link": "011a3368858067f33d38fd9120f4fec82ac6ef82",
    "jobs/progress": "3ea5be20c73abce962d33c8d203cf3edfda4ebf3",
    "jobs/purge": "aae98d98ae56ce4e33b1be9c3a70fc58e47e5caa",
    "jobs/recover": "a5539ccc8988a0d3d0a5f05fe0296822a75e1143",
    "jobs/renew": "d7eca0125faca3427fb999e3753ead1225ed40eb",
    "jobs/replay": "eed4fafdf5301e5b833b2d8371dc2220d61073c8",
    "jobs/schedule": "52a0735bb4d9469a7c2acbdc027c33ece36dea08",
    "jobs/settle": "53ac911cb527b3c8667e792280e5d54a50beb4b8",
    "jobs/watch": "b938007b784afdef17c72316a2a79b42f6da0203",
    "locks/acquire": "1ffa1b69f709ecc31c7d7fbcbc9ad81dbe1a34fc",
    "locks/extend": "1451f7dd00c1bb52a8b42d200dbe2dfb239e3029",
    "locks/inspect": "4c1c5320cc80a8bc64d2a333841f5eefa0b0c808",
    "locks/release": "916f618acf6cc07353371188389edef2796f4a02",
    "membership/heartbeat": "0c4d497e72c96b1df1d0aae4845e1ed4fd19491a",
    "spark/ids": "dae4979cfcf0d38a89abfa0926ba365690e5ec0a",
    "spark/write": "aeb95458624796115f692ff9b78ab3bfe6f7f6be",
    "streams/append": "8a427edb123a8f03428a160aeea6a2103bc5c30c",
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
