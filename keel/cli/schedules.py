"""`keel schedules ...`: crons and intervals that start runs (docs/cli.md, Schedules).

list, show, pause, resume and delete work on the database alone (--db or --app); create and
trigger admit runs of a workflow, so they take the App (--app or $KEEL_APP).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from keel.cli.guard import BAD_USAGE, fail, guarded, json_value, say
from keel.cli.options import AppOption, DbOption, JsonOption, open_app
from keel.cli.render import out, to_json

schedules_cli = typer.Typer(
    no_args_is_help=True,
    help="Schedules (crons and intervals that start runs): list, show, create, pause, resume, "
    "delete, trigger.",
)

ScheduleArgument = Annotated[str, typer.Argument(metavar="SCHEDULE", help="Its name or id.")]


class CatchUp(StrEnum):
    LATEST = "latest"
    ALL = "all"
    NONE = "none"


class Overlap(StrEnum):
    SKIP = "skip"
    ENQUEUE = "enqueue"
    ALLOW = "allow"


def _when(value: float | None) -> str:
    if value is None:
        return "-"
    return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(rows: list[dict[str, Any]]) -> Table:
    table = Table("name", "workflow", "timing", "thread", "policies", "next tick", "last tick")
    for r in rows:
        timing = f"cron {r['cron']} {r['timezone']}" if r["cron"] else f"every {r['every']:g} s"
        table.add_row(
            r["name"],
            r["workflow"],
            timing,
            r["thread_id"] or "-",
            f"catch_up={r['catch_up']} overlap={r['overlap']}",
            "paused" if r["paused"] else _when(r["next_tick"]),
            _when(r["last_tick"]),
        )
    return table


def _show(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(to_json(row))
    else:
        out().print(_table([row]))


@schedules_cli.command("list")
@guarded
def schedules_list(
    workflow: Annotated[
        str | None, typer.Option(help="Only schedules of this workflow.", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 100,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """List schedules by name, with their next and last ticks."""
    with open_app(app, db) as loaded:
        rows = loaded.schedules.list(workflow=workflow, limit=limit)
    if as_json:
        typer.echo(to_json(rows))
    elif rows:
        out().print(_table(rows))
    else:
        say("no schedules")


@schedules_cli.command("show")
@guarded
def schedules_show(
    schedule: ScheduleArgument,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """One schedule and its latest ticks."""
    with open_app(app, db) as loaded:
        row = loaded.schedules.get(schedule)
        ticks = loaded.schedules.ticks(schedule, limit=20)
    if as_json:
        typer.echo(to_json({**row, "ticks": ticks}))
        return
    _show(row, False)
    for t in ticks:
        say(f"{_when(t['tick'])}  {t['outcome']:<9}  {t['run_id'] or '-'}")


@schedules_cli.command("create")
@guarded
def schedules_create(
    name: Annotated[str, typer.Argument(help="The schedule's name (unique).")],
    workflow: Annotated[str, typer.Argument(help="Name of a workflow registered on APP.")],
    cron: Annotated[
        str | None,
        typer.Option(
            help="A cron expression: 5 fields, or 6 with seconds first.", show_default=False
        ),
    ] = None,
    every: Annotated[
        float | None, typer.Option(help="Seconds between ticks (at least 1).", show_default=False)
    ] = None,
    timezone: Annotated[str, typer.Option(help="The cron's timezone (IANA name).")] = "UTC",
    input_json: Annotated[
        str | None, typer.Option("--input", help="Each run's input, JSON.", show_default=False)
    ] = None,
    thread: Annotated[
        str | None, typer.Option(help="Start runs on this thread.", show_default=False)
    ] = None,
    catch_up: Annotated[CatchUp, typer.Option(help="Missed ticks after an outage.")] = (
        CatchUp.LATEST
    ),
    overlap: Annotated[Overlap, typer.Option(help="A tick while the last run goes on.")] = (
        Overlap.SKIP
    ),
    as_json: JsonOption = False,
    app: AppOption = None,
) -> None:
    """Create a schedule that starts a run of WORKFLOW at each tick."""
    if not (app or os.environ.get("KEEL_APP")):
        fail("keel schedules create needs --app MODULE:ATTRIBUTE: its workflow", BAD_USAGE)
    value: Any = None if input_json is None else json_value(input_json, "--input")
    with open_app(app, None) as loaded:
        row = loaded.schedules.create(
            name,
            workflow,
            cron=cron,
            every=every,
            timezone=timezone,
            input=value,
            thread_id=thread,
            catch_up=catch_up.value,
            overlap=overlap.value,
        )
    _show(row, as_json)


def _set_paused(
    schedule: str, paused: bool, as_json: bool, app: str | None, db: str | None
) -> None:
    """Pause or resume the schedule (on the database alone), then show it."""
    with open_app(app, db) as loaded:
        schedules = loaded.schedules
        _show(schedules.pause(schedule) if paused else schedules.resume(schedule), as_json)


@schedules_cli.command("pause")
@guarded
def schedules_pause(
    schedule: ScheduleArgument,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """No tick fires until it is resumed."""
    _set_paused(schedule, True, as_json, app, db)


@schedules_cli.command("resume")
@guarded
def schedules_resume(
    schedule: ScheduleArgument,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Ticks fire again from the next one (the ones missed while paused are not caught up)."""
    _set_paused(schedule, False, as_json, app, db)


@schedules_cli.command("delete")
@guarded
def schedules_delete(
    schedule: ScheduleArgument, app: AppOption = None, db: DbOption = None
) -> None:
    """Delete a schedule (its runs stay)."""
    with open_app(app, db) as loaded:
        loaded.schedules.delete(schedule)
    say(f"deleted schedule {schedule}")


@schedules_cli.command("trigger")
@guarded
def schedules_trigger(
    schedule: ScheduleArgument, as_json: JsonOption = False, app: AppOption = None
) -> None:
    """Start a run of the schedule now, beside its ticks."""
    if not (app or os.environ.get("KEEL_APP")):
        fail("keel schedules trigger needs --app MODULE:ATTRIBUTE: its workflow", BAD_USAGE)
    with open_app(app, None) as loaded:
        tick = loaded.schedules.trigger(schedule)
    if as_json:
        typer.echo(to_json({"schedule": tick.schedule, "tick": tick.tick, "run_id": tick.run_id}))
    else:
        say(f"triggered schedule {tick.schedule}: run {tick.run_id}")
