"""A directive that renders the ``streamkit`` command's help, command by command.

The reference is generated from the commands themselves, so it cannot drift from them.
(sphinx-click does not know asyncclick's command classes.)
"""

from __future__ import annotations

from typing import Any

import asyncclick as click
from docutils import nodes
from docutils.parsers.rst import Directive


def _walk(command: click.Command, path: list[str]) -> list[tuple[list[str], click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            found.extend(_walk(command.commands[name], [*path, name]))
    return found


class CliReference(Directive):
    has_content = False

    def run(self) -> list[nodes.Node]:
        from streamkit._cli import cli

        sections: list[nodes.Node] = []
        for path, command in _walk(cli, ["streamkit"]):
            name = " ".join(path)
            context = click.Context(command, info_name=name, terminal_width=88)
            section = nodes.section(ids=[nodes.make_id(name)])
            section += nodes.title(text=name)
            section += nodes.literal_block(text=command.get_help(context))
            sections.append(section)
        return sections


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("streamkit-cli", CliReference)
    return {"parallel_read_safe": True}
