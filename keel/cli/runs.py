"""`keel runs ...` (list, show, upgrade, cancel, watch, resume, replay) and `keel approvals list`.

`keel cancel` is the same command as `keel runs cancel`; keel.cli.commands adds it to the root.
"""

from __future__ import annotations

import functools
import os
from typing import Annotated

import typer

from keel.cli import observe, render, replay_view
from keel.cli.guard import fail, guarded, login, say
from keel.cli.options import (
    AppOption,
    ByOption,
    DbOption,
    JsonOption,
    RunArgument,
    listing,
    open_app,
)
from keel.cli.render import out
from keel.cli.summary_view import summary_view
from keel.core.lifecycle import Status
from keel.runtime import summary

runs_cli = typer.Typer(
    no_args_is_help=True,
    help="Runs: list, show, watch, cancel, resume, replay in a throwaway copy, upgrade.",
)
approvals_cli = typer.Typer(
    no_args_is_help=True, help="Approvals and other waits: list the open ones."
)


@runs_cli.command("list")
@guarded
def runs_list(
    status: Annotated[
        Status | None, typer.Option(help="Only runs in this status.", show_default=False)
    ] = None,
    workflow: Annotated[
        str | None, typer.Option(help="Only runs of this workflow.", show_default=False)
    ] = None,
    job_id: Annotated[
        str | None, typer.Option("--job-id", help="Only runs of this job.", show_default=False)
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only runs admitted at or after this: an age (2h, 7d) or an ISO time "
            "(2026-08-07T09:30, UTC unless it says otherwise).",
            show_default=False,
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            help="Only runs admitted before this (an age or an ISO time).", show_default=False
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs, newest first.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many runs first.")] = 0,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """List runs, newest first, with how long each took and how many attempts."""
    with open_app(app, db) as loaded:
        rows = loaded.list_runs(
            status=status.value if status else None,
            workflow=workflow,
            job_id=job_id,
            since=since,
            until=until,
            limit=limit,
            offset=offset,
        )
        now = loaded.database_now()
    for row in rows:
        row["duration"], row["attempts"] = summary.duration(row, now), summary.attempts(row)
    listing(rows, as_json, functools.partial(render.runs_table, now=now), "no runs match")


@runs_cli.command("show")
@guarded
def runs_show(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")],
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Show one run: first its summary (outcome and why, where the time went, attempts and
    takeovers, effects, waits, artifacts, crashes and resumes), then every detail."""
    with open_app(app, db) as loaded:
        details = loaded.get_run(run_id)
        now = loaded.database_now()
    brief = summary.summarize(details, now)
    if as_json:
        typer.echo(
            render.to_json({"summary": summary.to_dict(brief), **render.details_json(details)})
        )
    else:
        out().print(summary_view(brief))
        out().print(render.run_view(details, now))


@runs_cli.command("upgrade")
@guarded
def runs_upgrade(
    run_id: RunArgument,
    to: Annotated[str, typer.Option("--to", help="The version to move the run to.")],
    by: ByOption = None,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Move a queued or waiting run to another version of its workflow (see docs/versions.md).

    APP (--app or $KEEL_APP) must register that version: the run's checkpoint is checked
    against its graph, and the move is refused unless the nodes the run stopped before exist.
    """
    if not (app or os.environ.get("KEEL_APP")):
        fail("keel runs upgrade needs --app MODULE:ATTRIBUTE, the app with the new version", 2)
    with open_app(app, db) as loaded:
        row = loaded.upgrade_run(run_id, to=to, by=by or login())
    say(f"run {run_id} moved to {row['workflow']}@{row['workflow_version']}; {row['status']}")


@runs_cli.command("cancel")
@guarded
def cancel(
    run_id: RunArgument, by: ByOption = None, app: AppOption = None, db: DbOption = None
) -> None:
    """Cancel a run: queued or waiting at once, running at its next step boundary."""
    with open_app(app, db) as loaded:
        row = loaded.cancel(run_id, by=by or login())
    if row["status"] == "cancelled":
        say(f"cancelled run {run_id}")
    else:
        say(f"cancel requested: run {run_id} is {row['status']}; it stops at its next step")


@runs_cli.command("watch")
@guarded
def runs_watch(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")],
    after: Annotated[int, typer.Option(min=0, help="Start after this event id.")] = 0,
    follow: Annotated[
        bool,
        typer.Option(help="Keep following until the run finishes (--no-follow: print and exit)."),
    ] = True,
    poll: Annotated[float, typer.Option(min=0.05, help="Seconds between reads.")] = 0.25,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Follow a run's timeline live: its events so far, then new ones as they commit."""
    with open_app(app, db) as loaded:
        status = observe.watch(
            loaded, run_id, after=after, as_json=as_json, follow=follow, poll=poll
        )
    if not as_json:
        say(f"run {run_id} is {status}")


@runs_cli.command("resume")
@guarded
def resume(
    run_id: RunArgument, by: ByOption = None, app: AppOption = None, db: DbOption = None
) -> None:
    """Resume a failed run from its last checkpoint, with its ledger: effects it recorded are
    not performed again (unlike `keel submit --rerun`, which starts a new run)."""
    with open_app(app, db) as loaded:
        loaded.resume(run_id, by=by or login())
    say(f"resumed run {run_id}: queued; a worker continues it from its last checkpoint")


@runs_cli.command("replay")
@guarded
def runs_replay(
    run_id: RunArgument,
    from_step: Annotated[
        int | None,
        typer.Option(
            "--from", min=0, help="Replay from this step (default: the first).", show_default=False
        ),
    ] = None,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Re-execute a run's graph in a throwaway copy and report the first step that diverged.

    Effects are served from the run's ledger (never performed), approvals answered as
    recorded; the run itself is not touched. APP must register the run's workflow version.
    Exit code 0: no divergence; 3: diverged.
    """
    if not (app or os.environ.get("KEEL_APP")):
        fail("keel runs replay needs --app MODULE:ATTRIBUTE, the app with the run's workflow", 2)
    with open_app(app, db) as loaded:
        report = loaded.replay(run_id, from_step)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        out().print(replay_view.report_view(report))
    if report.diverged:
        raise typer.Exit(replay_view.DIVERGED)


@approvals_cli.command("list")
@guarded
def approvals_list(
    kind: Annotated[str | None, typer.Option(help="approval, effect or interrupt.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 100,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """List open waits (pending approvals first by deadline) across all runs."""
    with open_app(app, db) as loaded:
        rows = [w for w in loaded.pending_waits(limit) if kind is None or w["kind"] == kind]
    listing(rows, as_json, functools.partial(render.waits_table, across=True), "no open waits")
