"""Text from outside shown literally: control characters escaped, rich markup inert.

Error messages, field values, job ids, names and arguments, tracebacks, dead
letters, worker and stream names come from Redis, where producers, events and other
processes put them. Shown on a terminal or in a log line, they must be read, never
obeyed: an ANSI escape could recolour or rewrite the screen, a newline could forge a
log record, a bidirectional override could reorder what the reader sees, and rich
markup (``[/]``, ``[link=...]``) could crash a view or render as a link.

:func:`printable` escapes the characters a terminal acts on, Python-style
(``\\n``, ``\\x1b``, ``\\u202e``), keeping everything else as it is;
:func:`literal_text` wraps the result in a rich :class:`~rich.text.Text`, which rich
prints as it is. A ``Text``, rather than a string with its markup escaped
(``rich.markup.escape``), because rich reads more than markup in a string: emoji
codes (``:smile:``) too, which no escape function covers. Every view, every error
message and the console log format use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["literal_text", "printable"]


def _escapes() -> dict[int, str]:
    table = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
    table.update({ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"})
    # Line and paragraph separators, and the bidirectional controls (Trojan Source).
    for code in (0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)):
        table[code] = f"\\u{code:04x}"
    return table


_TABLE = str.maketrans(_escapes())


def printable(value: object) -> str:
    """``str(value)`` on one line with nothing a terminal acts on: control characters
    (C0, DEL, C1: newlines, tabs, ANSI escapes), line separators and bidirectional
    controls are written as Python escapes (``\\n``, ``\\x1b``, ``\\u202e``)."""
    text = value if isinstance(value, str) else str(value)
    # Printable text (the usual case) has none of them: skip the translation.
    return text if text.isprintable() else text.translate(_TABLE)


def literal_text(value: object, style: str = "") -> Text:
    """:func:`printable` as a rich ``Text``, which rich shows as it is (markup and
    emoji codes are not interpreted in a ``Text``)."""
    from rich.text import Text

    return Text(printable(value), style=style)
