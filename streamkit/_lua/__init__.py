"""The one loader of streamkit's Redis scripts: each a ``.lua`` file of this package.

Pure: no trio, no Redis client, nothing but the standard library, so that the Trio side
(:class:`streamkit._redis.LuaScript`), the blocking and asyncio clients and the Spark
executors all run the same :class:`Script` objects, made once per process
(:func:`script`).

**Layout.** A script is ``<piece>/<name>.lua`` (``commit/read.lua`` is the script
``commit/read``), grouped by the piece it serves: ``streams`` (append, metadata, relay,
outbox), ``commit`` (the fenced read, the woken read, the fenced commit), ``locks``,
``membership``, ``jobs``, ``admin``, ``spark``. The shared pieces scripts include are
under ``lib/`` (``lib/jobs/`` for the job scripts'), and are never scripts themselves.

**Header.** A file opens with its header: the comment lines (``--``) before its first
other line. The header is documentation, not sent to Redis. A script's header says its
contract in fields, ``-- NAME: text`` (continued on the lines after it, indented by two
spaces or more), after its prose::

    -- The fenced commit: applies the changes and acknowledges the consumer's events.
    --
    -- KEYS: stream, lock, written... (the keys the changes write)
    -- TAG: {partition}
    -- ARGV: lease, group, keep (0: do not trim), acks, id..., change...
    -- REPLY: -1 (the lease is not ours) | int (the number acknowledged)

* ``KEYS`` and ``ARGV``: names (lower case), comma-separated, each with an optional
  note in parentheses; ``name...`` stands for any number of them (zero or more), and
  ``(a, b)...`` for any number of such groups; ``none`` for none. In ``KEYS`` only the
  last may repeat: the number of keys is fixed unless it does (:attr:`Script.numkeys`).
  A key's name says what key it is (``stream``, ``lock``, ``ready_high``, ...):
  ``tests/test_lua.py`` builds each with streamkit's key layout and checks that a
  script's keys share one hash slot.
* ``TAG``: the hash tag every key shares (``{partition}``, ``{shard}``, ``{lock}``,
  ...), or ``none (why)`` for a script whose keys need not share one (it runs on one
  server only).
* ``REPLY``: the shape of the reply (:class:`Shape`): ``int``, ``str``, ``nil``, ``ok``
  (a status reply), ``any``, a literal number (``-1``), ``[shape]`` (an array of any
  length), ``{shape, shape}`` (an array of exactly these, each may be named:
  ``{ids: [str], last: str}``), alternatives separated by ``|``; notes in parentheses.
  ``tests/test_lua_replies.py`` runs every script and checks its reply has this shape.
* ``FLAGS`` (optional): the script's flags (``allow-oom``), rendered as its first line,
  ``#!lua flags=...``.

A lib piece's header is prose only: what the piece gives (its functions and what they
take), and what it shares with the pieces it works with.

**Includes.** A line ``--#include lib/<name>`` (alone on its line) is replaced by that
piece's text: each piece once per script, however many includes ask for it (the first
one places it); a piece may include others (what its functions call); a cycle or an
unknown name is a :class:`LuaSourceError` naming the file and line. A script includes
only what it uses: ``luacheck`` (``./dev nox -s lint``) reports an unused function or
lower-case local of any assembled script (a piece's upper-case declarations, its keys
and tables, may go unused).

**Constants.** A number (or text) that Python code knows too reaches a script as an
argument, or as ``K.NAME``: the loader declares ``local K = {...}`` at the top of each
script that reads one, with the names it reads, from :data:`CONSTANTS`, the one Python
mapping (the Python side reads it there, through the module of its piece). No script
text is spliced from Python, and no script steers a piece by assigning its variables:
a piece's state changes through its functions.

One room (about 600 lines): the grammar of headers, includes and constants is read
in one place, and described beside the code that reads it.

**API.** :func:`script` (the :class:`Script` of a name: ``name``, ``text``, ``sha``,
``numkeys``, ``header``, ``origins``), :func:`names` (every script), :func:`by_sha` (a
script by its digest, for error messages), :func:`inline` (a script of a test's or a
user's, from its text alone), :class:`Library` (the scripts of another folder, as the
tests make).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from importlib.resources.abc import Traversable

__all__ = [
    "CONSTANTS",
    "Header",
    "Library",
    "LuaSourceError",
    "Script",
    "Shape",
    "by_sha",
    "inline",
    "names",
    "script",
]

#: The suffix of every script and piece.
SUFFIX = ".lua"
#: The folder of the shared pieces.
LIB = "lib"

_INCLUDE = re.compile(r"--#include\s+(\S+)\s*\Z")
_FIELD = re.compile(r"--\s([A-Z]+):\s?(.*)\Z")
_CONTINUED = re.compile(r"--\s\s+(\S.*)\Z")
_FIELDS = ("KEYS", "TAG", "ARGV", "REPLY", "FLAGS")
_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")
_CONSTANT = re.compile(r"\bK\.([A-Za-z_][A-Za-z0-9_]*)")
_TAG = re.compile(r"\{([a-z_][a-z0-9_]*)\}\Z")
_ITEM = re.compile(r"([a-z_][a-z0-9_]*)(\.\.\.)?(?:\s*\(.*\))?")
_GROUP = re.compile(r"\(([^()]*)\)\.\.\.(?:\s*\(.*\))?")


class LuaSourceError(ValueError):
    """A script or piece that cannot be assembled: a bad header, an unknown or circular
    include. The message names the file and line."""


# ------------------------------------------------------------------ reply shapes


@dataclass(frozen=True)
class Shape:
    """The shape of a script's reply, as its header's ``REPLY`` says.

    Attributes:
        kind: ``int``, ``str``, ``nil``, ``ok``, ``any``, ``literal`` (``value``),
            ``list`` (any length of ``items[0]``), ``tuple`` (exactly ``items``) or
            ``either`` (one of ``items``).
        items: the shapes inside.
        value: a literal's value.
        names: a tuple's field names ("" where unnamed).
    """

    kind: str
    items: tuple[Shape, ...] = ()
    value: int | None = None
    names: tuple[str, ...] = ()

    def matches(self, reply: object) -> bool:
        """Whether ``reply`` (as redis-py or coredis parses it) has this shape."""
        kind = self.kind
        if kind == "any":
            return True
        if kind == "either":
            return any(item.matches(reply) for item in self.items)
        if kind == "int":
            return type(reply) is int
        if kind == "literal":
            return type(reply) is int and reply == self.value
        if kind == "str":
            return isinstance(reply, bytes | str)
        if kind == "nil":
            return reply is None
        if kind == "ok":
            return reply is True or reply in (b"OK", "OK")
        if not isinstance(reply, list | tuple):
            return False
        if kind == "list":
            return all(self.items[0].matches(item) for item in reply)
        return len(reply) == len(self.items) and all(
            shape.matches(item) for shape, item in zip(self.items, reply, strict=True)
        )

    @classmethod
    def parse(cls, text: str) -> Shape:
        """The shape ``text`` describes (see the module's docstring).

        Error handling:
            :class:`ValueError` naming what could not be read.
        """
        tokens = _shape_tokens(text)
        shape = _parse_either(tokens)
        if tokens:
            raise ValueError(f"unexpected {tokens[0]!r} in reply shape {text!r}")
        return shape


_SHAPE_TOKEN = re.compile(r"\s*(?:(\([^()]*\))|(-?\d+)|([a-z_][a-z0-9_]*)|(.))")


def _shape_tokens(text: str) -> list[str]:
    tokens = []
    for note, number, word, char in _SHAPE_TOKEN.findall(text.strip()):
        if note:
            continue  # a note, for the reader
        token = number or word or char
        if token.strip():
            tokens.append(token)
    return tokens


def _parse_either(tokens: list[str]) -> Shape:
    options = [_parse_one(tokens)]
    while tokens and tokens[0] == "|":
        tokens.pop(0)
        options.append(_parse_one(tokens))
    return options[0] if len(options) == 1 else Shape("either", tuple(options))


def _parse_one(tokens: list[str]) -> Shape:
    if not tokens:
        raise ValueError("a reply shape ends too early")
    token = tokens.pop(0)
    if token == "[":
        item = _parse_either(tokens)
        _expect(tokens, "]")
        return Shape("list", (item,))
    if token == "{":
        items: list[Shape] = []
        names: list[str] = []
        while tokens and tokens[0] != "}":
            name = ""
            if len(tokens) > 1 and tokens[1] == ":" and _NAME.match(tokens[0]):
                name = tokens.pop(0)
                tokens.pop(0)
            names.append(name)
            items.append(_parse_either(tokens))
            if tokens and tokens[0] == ",":
                tokens.pop(0)
        _expect(tokens, "}")
        return Shape("tuple", tuple(items), names=tuple(names))
    if token in ("int", "str", "nil", "ok", "any"):
        return Shape(token)
    if re.fullmatch(r"-?\d+", token):
        return Shape("literal", value=int(token))
    raise ValueError(f"unexpected {token!r} in a reply shape")


def _expect(tokens: list[str], token: str) -> None:
    if not tokens or tokens.pop(0) != token:
        raise ValueError(f"expected {token!r} in a reply shape")


# ------------------------------------------------------------------ headers


@dataclass(frozen=True)
class Header:
    """What a script's header says of it.

    Attributes:
        prose: its description.
        keys: the names of its fixed keys, in order.
        more_keys: the names of the keys it takes any number of (a group, repeated),
            after the fixed ones; empty if none.
        argv: the names of its fixed arguments.
        more_argv: the names of its arguments from the first one it takes any number
            of on.
        tag: the hash tag its keys share (``partition`` for ``{partition}``), or
            ``None`` when they need not share one (``TAG: none``).
        reply: its reply's shape.
        flags: its flags (``allow-oom``), empty if none.
    """

    prose: str
    keys: tuple[str, ...]
    more_keys: tuple[str, ...]
    argv: tuple[str, ...]
    more_argv: tuple[str, ...]
    tag: str | None
    reply: Shape
    flags: tuple[str, ...] = ()

    @property
    def numkeys(self) -> int | None:
        """The number of keys, or ``None`` when it varies (see :attr:`more_keys`)."""
        return None if self.more_keys else len(self.keys)


def _names(text: str, *, last_only: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A ``KEYS`` or ``ARGV`` field's fixed names, then the names from the first
    repeated one on (``last_only``: only one repeated name or group, the last)."""
    text = text.strip()
    if text == "none":
        return (), ()
    fixed: list[str] = []
    more: list[str] = []
    for item in _split(text):
        if more and last_only:
            raise ValueError(f"nothing may follow the repeated {', '.join(more)}")
        group = _GROUP.fullmatch(item)
        one = _ITEM.fullmatch(item)
        if group is not None:
            names = list(_split(group[1]))
            if not all(_NAME.match(name) for name in names):
                raise ValueError(f"a group holds names only, got ({group[1]})")
            more.extend(names)
        elif one is not None and (one[2] or more):
            more.append(one[1])
        elif one is not None:
            fixed.append(one[1])
        else:
            raise ValueError(
                f"{item!r} is not a name (lower case, digits, _), a name... or a "
                "(group)..., with an optional (note)"
            )
    return tuple(fixed), tuple(more)


def _split(text: str) -> Iterator[str]:
    """``text`` split at the commas outside parentheses, each part stripped."""
    depth, start = 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            yield text[start:i].strip()
            start = i + 1
    yield text[start:].strip()


def _tag(text: str) -> str | None:
    text = text.strip()
    if text == "none" or text.startswith("none "):
        return None
    match = _TAG.match(text.split(" ", 1)[0])
    if match is None:
        raise ValueError(f"a tag is {{name}} or none (why), got {text!r}")
    return match[1]


def parse_header(lines: list[str], where: str) -> Header:
    """A script's :class:`Header` from its header's lines.

    Error handling:
        :class:`LuaSourceError` naming ``where`` for a missing or malformed field.
    """
    prose: list[str] = []
    fields: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(lines, 1):
        match = _FIELD.match(line)
        if match is not None and match[1] in _FIELDS:
            if match[1] in fields:
                raise LuaSourceError(f"{where}:{number}: {match[1]} given twice")
            current = fields[match[1]] = [match[2]]
            continue
        continued = _CONTINUED.match(line)
        if current is not None and continued is not None:
            current.append(continued[1])
            continue
        if current is not None:
            raise LuaSourceError(f"{where}:{number}: prose after the header's fields")
        prose.append(line.removeprefix("--").removeprefix(" "))
    missing = [name for name in ("KEYS", "ARGV", "REPLY") if name not in fields]
    if missing:
        raise LuaSourceError(f"{where}: its header lacks {', '.join(missing)}")
    text = {name: " ".join(parts).strip() for name, parts in fields.items()}
    try:
        keys, more_keys = _names(text["KEYS"], last_only=True)
        argv, more_argv = _names(text["ARGV"], last_only=False)
        if "TAG" not in text and (keys or more_keys):
            raise ValueError("a script with keys names their hash TAG")
        tag = _tag(text["TAG"]) if "TAG" in text else None
        reply = Shape.parse(text["REPLY"])
    except ValueError as exc:
        raise LuaSourceError(f"{where}: {exc}") from None
    flags = tuple(text.get("FLAGS", "").replace(",", " ").split())
    return Header("\n".join(prose).strip(), keys, more_keys, argv, more_argv, tag, reply, flags)


# ------------------------------------------------------------------ scripts


@dataclass(frozen=True, eq=False)
class Script:
    """A script as every driver runs it: assembled once, the same object for all.

    Attributes:
        name: its name, ``commit/read`` (its file ``streamkit/_lua/commit/read.lua``).
        text: its source as sent to Redis (the header left out, includes resolved).
        sha: its SHA1 digest, as ``EVALSHA`` names it.
        header: its header (``None`` for an inline script).
        origins: where each line of ``text`` comes from: ``(file, line)``, the file
            relative to the library (``lib/trim.lua``).
    """

    name: str
    text: str
    header: Header | None = field(repr=False)
    origins: tuple[tuple[str, int], ...] = field(repr=False, default=())
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.text.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", sha)
        _known.setdefault(sha, self)

    @property
    def numkeys(self) -> int | None:
        """The number of keys it takes, or ``None`` when it varies (or is not said)."""
        return None if self.header is None else self.header.numkeys

    def origin(self, line: int) -> tuple[str, int]:
        """The file and line that line ``line`` (from 1) of :attr:`text` comes from;
        ``(name, line)`` for an inline script."""
        if 1 <= line <= len(self.origins):
            return self.origins[line - 1]
        return self.name, line


# Every script made in this process, by digest: an error inside one names its digest.
_known: dict[str, Script] = {}


def by_sha(sha: str) -> Script | None:
    """The script with digest ``sha``, if this process made it."""
    return _known.get(sha)


def inline(text: str, name: str = "<inline>") -> Script:
    """A script from its text alone (a test's, a user's): no header, no includes."""
    found = _known.get(hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest())
    return found if found is not None and found.text == text else Script(name, text, None)


class Library:
    """The scripts of one folder (the package's own: :func:`script`).

    Args:
        root: the folder.
        constants: what ``K.NAME`` reads in its scripts (the package's:
            :data:`CONSTANTS`).
    """

    def __init__(self, root: Traversable, constants: Mapping[str, int | str]) -> None:
        self._root = root
        self._constants = constants
        self._cache: dict[str, Script] = {}

    def script(self, name: str) -> Script:
        """The script ``name`` (``commit/read``), assembled on first need.

        Error handling:
            :class:`LuaSourceError` for a script that does not exist or cannot be
            assembled.
        """
        found = self._cache.get(name)
        if found is None:
            if name.split("/", 1)[0] == LIB:
                raise LuaSourceError(f"{name} is a shared piece, not a script")
            found = self._cache[name] = self._assemble(name)
        return found

    def names(self) -> list[str]:
        """Every script's name, sorted (the pieces under ``lib/`` are not scripts)."""
        found: list[str] = []

        def walk(folder: Traversable, prefix: str) -> None:
            for entry in folder.iterdir():
                if entry.is_dir() and entry.name != LIB and not entry.name.startswith("_"):
                    walk(entry, f"{prefix}{entry.name}/")
                elif entry.name.endswith(SUFFIX) and prefix:
                    found.append(prefix + entry.name.removesuffix(SUFFIX))

        walk(self._root, "")
        return sorted(found)

    def _read(self, name: str, where: str) -> list[str]:
        path = self._root.joinpath(*f"{name}{SUFFIX}".split("/"))
        if not path.is_file():
            raise LuaSourceError(f"{where}: there is no {name}{SUFFIX}")
        return path.read_text(encoding="utf-8").splitlines(keepends=True)

    def _assemble(self, name: str) -> Script:
        lines = self._read(name, "streamkit._lua")
        size = _header_size(lines)
        header = parse_header([line.rstrip("\n") for line in lines[:size]], name + SUFFIX)
        out: list[str] = []
        origins: list[tuple[str, int]] = []
        if header.flags:
            out.append(f"#!lua flags={','.join(header.flags)}\n")
            origins.append((name + SUFFIX, 0))
        self._body(name, lines, size, out, origins, done=set(), stack=[name])
        table = self._table(out, origins)
        at = 1 if header.flags else 0
        out[at:at] = table
        origins[at:at] = [(CONSTANTS_ORIGIN, 0)] * len(table)
        return Script(name, "".join(out), header, tuple(origins))

    def _table(self, out: list[str], origins: list[tuple[str, int]]) -> list[str]:
        """The lines that declare ``K``, with the constants the script reads (none if it
        reads none).

        Error handling:
            :class:`LuaSourceError` for a name that is not a constant.
        """
        used: dict[str, int | str] = {}
        for line, (file, number) in zip(out, origins, strict=True):
            for name in _CONSTANT.findall(line):
                if name not in self._constants:
                    raise LuaSourceError(f"{file}:{number}: K.{name} is not a constant")
                used[name] = self._constants[name]
        if not used:
            return []
        return [
            "local K = {\n",
            *(f"  {name} = {_lua_value(used[name])},\n" for name in sorted(used)),
            "}\n",
        ]

    def _body(
        self,
        name: str,
        lines: list[str],
        start: int,
        out: list[str],
        origins: list[tuple[str, int]],
        *,
        done: set[str],
        stack: list[str],
    ) -> None:
        """Append the text of ``name`` from line ``start`` (from 0) on, includes
        resolved, to ``out``, and where each line comes from to ``origins``."""
        file = name + SUFFIX
        for number in range(start, len(lines)):
            line = lines[number]
            include = _INCLUDE.match(line.rstrip("\n"))
            if include is None:
                out.append(line)
                origins.append((file, number + 1))
                continue
            piece = include[1]
            where = f"{file}:{number + 1}"
            if piece.split("/", 1)[0] != LIB:
                raise LuaSourceError(f"{where}: includes {piece}, not a piece of {LIB}/")
            if piece in stack:
                cycle = " -> ".join([*stack[stack.index(piece) :], piece])
                raise LuaSourceError(f"{where}: includes {piece} again, a cycle: {cycle}")
            if piece in done:
                continue  # each piece once per script
            done.add(piece)
            included = self._read(piece, where)
            stack.append(piece)
            self._body(
                piece, included, _header_size(included), out, origins, done=done, stack=stack
            )
            stack.pop()


def _lua_value(value: int | str) -> str:
    """``value`` as a Lua literal."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"a constant is a whole number or text, got {value!r}")
    if isinstance(value, int):
        return str(value)
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"


def _header_size(lines: list[str]) -> int:
    """How many of ``lines`` are the header: the comment lines before the first other
    line (an include line ends it too)."""
    for number, line in enumerate(lines):
        if not line.startswith("--") or _INCLUDE.match(line.rstrip("\n")):
            return number
    return len(lines)


#: What scripts read as ``K.NAME``: the one place each of these numbers is set, for
#: the scripts and for the Python code (which reads it here, through the module of its
#: piece). The loader declares ``K`` on a script's first line with the names it reads.
CONSTANTS: Mapping[str, int | str] = MappingProxyType(
    {
        # Entries one append removes under the hard cap, beyond as many as it appended
        # (lib/append; streamkit._wire.TRIM_STEP).
        "TRIM_STEP": 1_000,
        # Entries one call removes when it trims processed entries, beyond as many as
        # it appended or acknowledged (lib/trim; streamkit._wire.TRIM_PROCESSED_STEP).
        "TRIM_PROCESSED_STEP": 50_000,
        # The consumer group of every ready stream of a job queue.
        "JOB_GROUP": "workers",
        # Entries a job queue shard's event stream keeps, about (lib/jobs/events;
        # streamkit.jobs._events.EVENTS_KEEP).
        "EVENTS_KEEP": 10_000,
        # Dependents a job script settles per call, beside its own work.
        "SETTLE_BUDGET": 100,
        # Scheduled jobs a claim moves to their ready streams per call, at most.
        "DUE_BUDGET": 100,
        # Limit scopes a claim looks at again per call, at most.
        "WAKE_BUDGET": 20,
        # Held jobs let out of one park list per call, at most.
        "UNPARK_BUDGET": 100,
        # Ready entries a claim holds back per call before it stops reading.
        "READ_BUDGET": 100,
        # How often a scope with jobs waiting for a concurrency slot is looked at
        # again (ms), beside the slot's release.
        "CONC_RECHECK_MS": 2000,
        # How long a debounce key outlives its pending job's time (ms): an enqueue
        # merges into the job while it is scheduled and the key lives
        # (jobs/enqueue; streamkit.jobs._plan.DEBOUNCE_KEEP_MS).
        "DEBOUNCE_KEEP_MS": 3_600_000,
    }
)
#: The origin (see :attr:`Script.origins`) of the line that declares ``K``.
CONSTANTS_ORIGIN = "<constants>"

_LIBRARY = Library(importlib.resources.files(__name__), CONSTANTS)


@functools.cache
def script(name: str) -> Script:
    """The package's script ``name`` (``commit/read``): one object per process.

    Error handling:
        :class:`LuaSourceError` if there is no such script or it cannot be assembled.
    """
    return _LIBRARY.script(name)


def names() -> list[str]:
    """The name of every script of the package, sorted."""
    return _LIBRARY.names()
