"""`keel versions accept NAME@VERSION`: hold a workflow version to its graph as it is now."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from keel.cli.guard import fail, guarded, login, say
from keel.cli.options import AppOption, ByOption, DbOption, open_app

versions_cli = typer.Typer(
    no_args_is_help=True,
    help="Workflow versions: accept a version's edited graph (see docs/versions.md).",
)


@versions_cli.command("accept")
@guarded
def accept(
    key: Annotated[str, typer.Argument(metavar="NAME@VERSION", help="The workflow version.")],
    by: ByOption = None,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Hold NAME@VERSION to its graph as APP registers it now, in place of the one it was first
    served with, so workers with that graph stop refusing it (once restarted).

    Only for a change that moves no run elsewhere (a router renamed, a reducer moved, a library
    upgrade): a node renamed or removed would end the runs paused there. Give such a change a
    new version and move runs with `keel runs upgrade`.
    """
    if not (app or os.environ.get("KEEL_APP")):
        fail("keel versions accept needs --app MODULE:ATTRIBUTE, the app with that graph", 2)
    name, at, version = key.rpartition("@")
    if not at or not name or not version:
        fail(f"expected NAME@VERSION, got {key!r}", 2)
    with open_app(app, db) as loaded:
        change = loaded.accept_graph(name, version, by=by or login())
    if change is None:
        say(f"{key}: its graph is already the one it is held to; nothing changed")
    else:
        say(f"{key} is held to its graph as registered now ({change}); restart refusing workers")
