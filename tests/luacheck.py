"""luacheck over every Redis script of streamkit, as Redis runs it: assembled.

Each script is linted whole, its includes resolved and its constants declared (what
``streamkit._lua`` sends to Redis), so that an unused function of a piece a script
includes, or a name it reads that nothing declares, is found in that script. Every
report is given at the file and line it came from (a piece's, most often), once, with
the scripts it was found in. Run by ``./dev nox -s lint``; ``python tests/luacheck.py``
alone. Exits 1 on any report, 2 if luacheck is missing (``./dev`` installs it: Debian's
``lua-check``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from streamkit import _lua

#: What Redis's Lua gives a script besides Lua 5.1's standard library.
REDIS_GLOBALS = ("redis", "KEYS", "ARGV", "cjson", "cmsgpack", "bit", "struct", "unpack")

#: luacheck's options. Unused upper-case locals are a piece's declarations (the shard's
#: keys, its tables), which a script may leave unused; an unused function or lower-case
#: local is reported (a script includes only what it uses).
OPTIONS = (
    "--std",
    "lua51",
    "--read-globals",
    *REDIS_GLOBALS,
    "--max-line-length",
    "100",
    "--ignore",
    "211/^[A-Z][A-Z0-9_]*$",
    "--codes",
    "--no-color",
    "--formatter",
    "plain",
)

_REPORT = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<text>.*)$")
_ROOT = Path(_lua.__file__).parent


def reports(library: _lua.Library | None = None, names: list[str] | None = None) -> list[str]:
    """luacheck's reports on the assembled scripts ``names`` (default: all) of
    ``library`` (default: streamkit's), each at the file and line it came from.

    Error handling:
        :class:`FileNotFoundError` if luacheck is not installed.
    """
    luacheck = shutil.which("luacheck")
    if luacheck is None:
        raise FileNotFoundError("luacheck is not installed (Debian: apt-get install lua-check)")
    get = _lua.script if library is None else library.script
    if names is None:
        names = _lua.names() if library is None else library.names()
    scripts = {name: get(name) for name in names}
    found: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for name, script in scripts.items():
            path = Path(folder) / (name.replace("/", "__") + ".lua")
            path.write_text(script.text)
            files[str(path)] = name
        run = subprocess.run(
            [luacheck, *OPTIONS, *files], capture_output=True, text=True, check=False
        )
        if run.returncode > 1 and not run.stdout.strip():
            raise RuntimeError(f"luacheck failed: {run.stderr.strip()}")
        for line in run.stdout.splitlines():
            match = _REPORT.match(line)
            if match is None or match["file"] not in files:
                continue
            name = files[match["file"]]
            file, number = scripts[name].origin(int(match["line"]))
            where = (
                f"streamkit/_lua/{file}:{number}:{match['col']}"
                if file != _lua.CONSTANTS_ORIGIN
                else f"{file} of {name}"
            )
            found.setdefault(f"{where}: {match['text']}", []).append(name)
    return [f"{report} (in {', '.join(sorted(names))})" for report, names in found.items()]


def main() -> int:
    """Lint every script; print each report; 0 if there is none."""
    try:
        found = reports()
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    for report in found:
        print(report)
    count = len(_lua.names())
    print(f"luacheck: {len(found)} reports in {count} assembled scripts", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
