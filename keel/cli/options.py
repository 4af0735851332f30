"""What every `keel` command shares: the --app/--db/--json options and the run, decision and
wait options, the App a command opens, and how a listing prints.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.table import Table

from keel.cli import render
from keel.cli.guard import (
    BAD_USAGE,
    OPTIONS_HINT,
    check_database,
    fail,
    json_object,
    json_value,
    say,
)
from keel.cli.render import out
from keel.core.store.base import Row
from keel.runtime.app import App
from keel.runtime.loading import load_app
from keel.runtime.runtime import DEFAULT_URL

# No `envvar=` on these two: the command line must outrank the environment as a pair (see
# open_app), so the environment is read there.
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        show_default=False,
        help="MODULE:ATTRIBUTE of a keel.App whose database to use (env: KEEL_APP).",
    ),
]
DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        show_default=False,
        help="Database URL: sqlite:///path or postgresql://... (env: KEEL_DATABASE_URL; "
        f"default: {DEFAULT_URL}).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
AfterOption = Annotated[
    str | None,
    typer.Option(
        "--after",
        help="Delay the run: seconds or a duration (90s, 5m, 2h). It is admitted now and no "
        "worker claims it before that time, by the database's clock.",
        show_default=False,
    ),
]

ByOption = Annotated[
    str | None,
    typer.Option("--by", help="Who decides (default: your login name).", show_default=False),
]
CommentOption = Annotated[
    str | None, typer.Option(help="A note kept with the decision.", show_default=False)
]
WaitOption = Annotated[
    str | None,
    typer.Option("--wait-id", help="Which wait, if the run waits on several.", show_default=False),
]
ActionOption = Annotated[
    str | None,
    typer.Option(
        "--action-id", help="Id of the click/request, kept for the audit.", show_default=False
    ),
]
RunArgument = Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")]


def performed_result(result: str | None, performed: bool) -> object:
    """`--result` of a settled in-doubt effect or intent: JSON, and only with --performed."""
    if result is None:
        return None
    if not performed:
        fail("--result only goes with --performed", BAD_USAGE)
    return json_value(result, "--result")


def listing(rows: list[Row], as_json: bool, table: Callable[[list[Row]], Table], none: str) -> None:
    """JSON for scripts (JSON columns decoded), else a table, or a line saying there is none."""
    if as_json:
        typer.echo(render.to_json([render.decoded(r) for r in rows]))
    elif rows:
        out().print(table(rows))
    else:
        say(none)


@contextmanager
def open_app(
    app_spec: str | None, db: str | None, *, existing: bool = True, hint: str = OPTIONS_HINT
) -> Iterator[App]:
    """The App a command works on (given on the command line), closed afterwards.

    The command line outranks the environment; at the same level --app outranks --db, and an
    --app and a --db that disagree are an error rather than a guess.
    """
    if app_spec:
        app = load_app(app_spec)
        if db and db != app.url:
            app.close()
            fail(
                f"--app {app_spec} uses {render.redact(app.url)} but --db says "
                f"{render.redact(db)}: pass one of them",
                BAD_USAGE,
            )
    elif db:
        app = App(db)
    elif os.environ.get("KEEL_APP"):
        app = load_app(os.environ["KEEL_APP"])
    else:
        app = App()  # $KEEL_DATABASE_URL, then the default
    try:
        check_database(app, existing=existing, hint=hint)
        yield app
    finally:
        app.close()


def metadata_filter(items: list[str] | None) -> dict[str, Any]:
    """`--metadata KEY=VALUE` (VALUE read as JSON when it is: `tier=2` is the number) or a
    JSON object, repeated: what every matching thread's metadata holds."""
    found: dict[str, Any] = {}
    for item in items or []:
        if item.lstrip().startswith("{"):
            found.update(json_object(item, "--metadata") or {})
            continue
        key, equals, raw = item.partition("=")
        if not equals or not key:
            fail(f"--metadata {item!r}: give KEY=VALUE or a JSON object", BAD_USAGE)
        try:
            found[key] = json.loads(raw)
        except json.JSONDecodeError:
            found[key] = raw
    return found
