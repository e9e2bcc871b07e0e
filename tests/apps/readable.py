"""An app for ``streamkit read`` and ``tail``: a stream of notes over 4 partitions, and
an output stream declared where it is made (no module attribute names it)."""

from __future__ import annotations

from streamkit import App, Record

app = App("readable")


class Note(Record):
    key: str
    n: int
    text: str = ""


notes = app.stream("notes", record=Note, partition_by="key", partition_count=4)
app.stream("digests", record=dict, partition_by=lambda r: r["key"], partition_count=2)
