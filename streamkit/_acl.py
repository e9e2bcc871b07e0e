"""Redis ACL refusals (``NOPERM``) told as one line: what the user may not do, and what to grant.

Redis refuses a command the connection's user may not run, or a key or channel it may
not touch, with a ``NOPERM`` error; inside a Lua script, Redis 7.0 names neither the
command nor the key, only the script's digest and line. This module turns each form
into :class:`~streamkit.lowlevel.NotPermitted`, naming the command (looked up in the script's
source for a refusal inside a script) and the ACL rule that would allow it. It is
pure: :mod:`streamkit._redis` hands it the error's text, and every script streamkit
runs is known to :mod:`streamkit._lua` by its digest.

The commands each role needs are listed as ``ACL SETUSER`` lines in
``docs/security.md``.
"""

from __future__ import annotations

import re

from . import _lua
from ._errors import NotPermitted

__all__ = ["not_permitted"]

# Commands whose first argument is a subcommand: ACL rules name both (+xinfo|groups).
_CONTAINERS = frozenset(
    {"acl", "client", "cluster", "command", "config", "function", "memory", "object"}
    | {"pubsub", "script", "slowlog", "xgroup", "xinfo", "latency", "module"}
)

# Redis 7.0: "this user has no permissions to run the 'xadd' command";
# Redis 7.2: "User producer has no permissions to run the 'xadd' command".
_COMMAND = re.compile(r"(?:User (\S+)|this user) has no permissions to run the '([^']+)' command")
# 7.0: "... to access one of the keys used as arguments"; 7.2: "No permissions to access a key".
_KEY = re.compile(r"no permissions to access (?:one of the keys|a key)", re.IGNORECASE)
_CHANNEL = re.compile(r"no permissions to access (?:one of the channels|a channel)", re.IGNORECASE)
# Inside a script (7.0): "The user executing the script can't run this command or
# subcommand script: <sha>, on @user_script:<line>." and "... can't access at least one
# of the keys mentioned in the command arguments script: <sha>, on @user_script:<line>."
_SCRIPT_COMMAND = "can't run this command or subcommand"
_SCRIPT_KEY = "can't access at least one of the keys"
_SCRIPT_CHANNEL = "can't publish to the channel"
_SCRIPT_WHERE = re.compile(r"script: ([0-9a-f]{40}), on @user_script:(\d+)")
_CALL = re.compile(r"""redis\.p?call\(\s*(['"])(\w+)\1(?:\s*,\s*(['"])(\w+)\3)?""")


def not_permitted(text: str, url: str) -> NotPermitted | None:
    """The ACL refusal that ``text`` (a Redis error's message) reports, or ``None``.

    Args:
        text: the error's message, with or without its ``NOPERM`` / ``ERR`` code.
        url: the server's URL, masked, for the message.
    """
    match = _COMMAND.search(text)
    if match is not None:
        return NotPermitted(url, "command", match[2].lower(), user=match[1])
    kind = "key" if _KEY.search(text) else "channel" if _CHANNEL.search(text) else None
    if kind is not None:
        return NotPermitted(url, kind, None)
    if _SCRIPT_COMMAND in text or _SCRIPT_KEY in text or _SCRIPT_CHANNEL in text:
        kind = "command" if _SCRIPT_COMMAND in text else "key" if _SCRIPT_KEY in text else "channel"
        return NotPermitted(url, kind, _script_command(text), in_script=True)
    return None


def _script_command(text: str) -> str | None:
    """The command on the line of the script that a refusal names, if it can be read."""
    where = _SCRIPT_WHERE.search(text)
    if where is None:
        return None
    script = _lua.by_sha(where[1])
    if script is None:
        return None
    lines = script.text.splitlines()
    number = int(where[2])
    if not 1 <= number <= len(lines):
        return None
    call = _CALL.search(lines[number - 1])
    if call is None:
        return None
    command = call[2].lower()
    if command in _CONTAINERS and call[4] is not None:
        return f"{command}|{call[4].lower()}"
    return command
