"""`keel effects ...` (list, retry, resolve): the outbox's dead letters and in-doubt intents,
and `keel dispatcher APP`: delivering outbox intents without executing runs."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from keel.cli.guard import APP_HINT, check_database, guarded, say
from keel.cli.options import (
    AppOption,
    ByOption,
    DbOption,
    JsonOption,
    listing,
    open_app,
    performed_result,
)
from keel.core.effects.outbox import IntentStatus
from keel.runtime.loading import load_app

effects_cli = typer.Typer(
    no_args_is_help=True,
    help="Outbox effects: list intents (dead letters, in doubt), retry or resolve one.",
)
IntentArgument = Annotated[str, typer.Argument(metavar="INTENT", help="The intent's id.")]


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table("intent", "effect", "run", "status", "attempts", "error")
    for r in rows:
        table.add_row(
            r["intent_id"],
            r["effect"],
            r["run_id"],
            r["status"],
            f"{r['attempts']}/{r['max_attempts']}",
            (r["error"] or "")[:80],
        )
    return table


@effects_cli.command("list")
@guarded
def effects_list(
    state: Annotated[
        IntentStatus | None,
        typer.Option("--state", help="Only intents in this state.", show_default=False),
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run", help="Only this run's intents.", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, oldest first.")] = 100,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """List outbox intents, oldest first (e.g. --state dead: the dead letters)."""
    with open_app(app, db) as loaded:
        rows = loaded.effect_intents(
            state=state.value if state else None, run_id=run_id, limit=limit
        )
    listing(rows, as_json, _table, "no intents match")


@effects_cli.command("retry")
@guarded
def effects_retry(
    intent_id: IntentArgument, by: ByOption = None, app: AppOption = None, db: DbOption = None
) -> None:
    """Deliver a dead intent again (attempts from zero), once its provider is fixed."""
    with open_app(app, db) as loaded:
        row = loaded.retry_intent(intent_id, by=by)
    say(f"intent {row['intent_id']} is pending again: a dispatcher delivers it")


@effects_cli.command("resolve")
@guarded
def effects_resolve(
    intent_id: IntentArgument,
    performed: Annotated[
        bool,
        typer.Option(
            "--performed/--not-performed",
            help="Whether the intent reached the provider (check there first).",
            show_default=False,
        ),
    ],
    result: Annotated[
        str | None,
        typer.Option(help="With --performed: the provider's result as JSON.", show_default=False),
    ] = None,
    by: ByOption = None,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Settle an in-doubt intent: --performed (never send it) or --not-performed (send once)."""
    value = performed_result(result, performed)
    with open_app(app, db) as loaded:
        row = loaded.resolve_intent(intent_id, performed=performed, result=value, by=by)
    say(f"intent {row['intent_id']} is {row['status']}")


@guarded
def dispatcher(
    app: str = typer.Argument(..., help="MODULE:ATTRIBUTE of a keel.App"),
) -> None:
    """Deliver APP's outbox effects until stopped (SIGTERM/SIGINT), executing no run."""
    loaded = load_app(app)
    try:
        check_database(loaded, hint=APP_HINT)
        loaded.run_dispatcher()
    finally:
        loaded.close()
    say("dispatcher stopped")
