"""The `keel` command: migrate, submit, run workers, inspect runs, decide waits.

Every command reaches its database through `--app MODULE:ATTR` (a keel.App; $KEEL_APP) or
`--db URL` ($KEEL_DATABASE_URL), defaulting to the App default `sqlite:///.keel/keel.db`.
Keel's own errors become one red line on stderr and a non-zero exit: 2 for bad usage or input,
1 for everything else. See docs/cli.md.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from keel.chaos.command import chaos as chaos_command
from keel.cli import observe, render
from keel.cli.guard import (
    APP_HINT,
    BAD_USAGE,
    OPTIONS_HINT,
    IfExists,
    bad_spec_is_usage,
    check_database,
    check_kind,
    fail,
    guarded,
    login,
    read_input,
    say,
    warn,
)
from keel.cli.render import decided_line, out
from keel.core.lifecycle import Status
from keel.core.store.base import Row
from keel.runtime.app import App
from keel.runtime.loading import load_app
from keel.runtime.runtime import DEFAULT_URL

cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Crash-safe LangGraph runs.",
    # A traceback's locals could show a database password.
    pretty_exceptions_show_locals=False,
)
runs_cli = typer.Typer(no_args_is_help=True, help="Inspect runs: list them, show one in full.")
cli.add_typer(runs_cli, name="runs")
approvals_cli = typer.Typer(
    no_args_is_help=True, help="Approvals and other waits: list the open ones."
)
cli.add_typer(approvals_cli, name="approvals")


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


def _listing(
    rows: list[Row], as_json: bool, table: Callable[[list[Row]], Table], none: str
) -> None:
    """JSON for scripts (JSON columns decoded), else a table, or a line saying there is none."""
    if as_json:
        typer.echo(render.to_json([render.decoded(r) for r in rows]))
    elif rows:
        out().print(table(rows))
    else:
        say(none)


@cli.callback()
def root() -> None:
    """Keel: admitted, resumable LangGraph runs whose side effects happen once."""


# -- plumbing ---------------------------------------------------------------------------------


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


# -- commands ---------------------------------------------------------------------------------


@cli.command()
@guarded
def migrate(app: AppOption = None, db: DbOption = None) -> None:
    """Create or upgrade Keel's tables (and LangGraph's checkpoint tables). Safe to repeat."""
    with open_app(app, db, existing=False) as loaded:
        applied = loaded.migrate()
        version = loaded.schema_version()
        latest = loaded.latest_schema_version
        where = render.redact(loaded.url)
        if applied:
            say(f"applied {', '.join(applied)} to {where}: now at version {version}")
        elif version > latest:
            fail(
                f"{where} is at version {version}, newer than version {latest} that this Keel "
                "knows: upgrade Keel on this machine"
            )
        else:
            say(f"{where} is already at version {version}: nothing to apply")


@cli.command()
@guarded
def demo(
    workdir: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the demo's database (default: .keel/demo).", show_default=False
        ),
    ] = None,
) -> None:
    """Run the bundled offline demo end to end: crashes on purpose, emails sent once."""
    try:
        module = importlib.import_module("keel.demo.story")
    except ModuleNotFoundError as exc:
        if exc.name != "keel.demo.story":
            raise
        fail("this installation of Keel has no demo (keel.demo.story is missing)")
    code = module.run_demo() if workdir is None else module.run_demo(workdir)
    raise typer.Exit(int(code or 0))


@cli.command()
@guarded
@observe.logged
def worker(
    app: str = typer.Argument(..., help="MODULE:ATTRIBUTE of a keel.App"),
    concurrency: int = typer.Option(4, min=1),
    stop_when_idle: bool = typer.Option(False, help="Exit when no run is queued or running."),
    grace: float = typer.Option(30.0, help="Seconds running runs get to finish on SIGTERM."),
    metrics_port: int | None = typer.Option(
        None,
        min=0,
        max=65535,
        show_default=False,
        help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics (see --metrics-host).",
    ),
    metrics_host: str = typer.Option("127.0.0.1", help="Interface for --metrics-port."),
    prune_older_than: str | None = typer.Option(
        None,
        show_default=False,
        help="Also prune finished runs older than this (30d, 12h) every hour.",
    ),
    max_clock_skew: float | None = typer.Option(
        None,
        min=0,
        help="Refuse to start when this host's clock is further than this many seconds from "
        "the database's (default $KEEL_MAX_CLOCK_SKEW, else 300; 0: no limit).",
    ),
) -> None:
    """Execute runs of APP's workflows until stopped (SIGTERM drains; twice stops now)."""
    loaded = load_app(app)
    try:
        check_database(loaded, hint=APP_HINT)
        if metrics_port is not None:
            from keel.service.metrics import metrics_for

            metrics_for(loaded).serve(metrics_port, metrics_host)
        stats = loaded.run_worker(
            concurrency=concurrency,
            stop_when_idle=stop_when_idle,
            grace=grace,
            prune_older_than=prune_older_than,
            max_clock_skew=max_clock_skew,
        )
    finally:
        loaded.close()
    typer.echo(f"worker stopped: {stats}")


@cli.command()
@guarded
@observe.logged
def serve(
    app: Annotated[str, typer.Argument(help="MODULE:ATTRIBUTE of a keel.App")],
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
) -> None:
    """Serve APP's HTTP API (runs, approvals, health) until SIGINT/SIGTERM; see docs/http.md.

    Requests only record and wake: run workers separately (`keel worker APP`). Bearer tokens
    come from $KEEL_API_TOKENS, the Slack signing secret from $KEEL_SLACK_SIGNING_SECRET.
    """
    from keel.service.auth import ENV as TOKENS_ENV
    from keel.service.auth import load_tokens
    from keel.service.server import serve as serve_http

    check_database(load_app(app), hint=APP_HINT)
    if not load_tokens(None):
        warn(
            f"no API tokens: ${TOKENS_ENV} is empty, so every request but /healthz and /readyz "
            f"gets 401 (e.g. {TOKENS_ENV}='ops-token=*'; see docs/http.md)"
        )
    # Given the spec, the server owns the App and closes it when uvicorn shuts down.
    serve_http(
        app, host=host, port=port, log_level=logging.getLevelName(logging.getLogger().level).lower()
    )


@cli.command()
@guarded
def submit(
    app: Annotated[str, typer.Argument(help="MODULE:ATTRIBUTE of a keel.App")],
    workflow: Annotated[str, typer.Argument(help="Name of a workflow registered on APP.")],
    job_id: Annotated[str, typer.Option("--job-id", help="Stable, readable id of the job.")],
    input_json: Annotated[
        str | None, typer.Option("--input", help="The run's input as JSON.", show_default=False)
    ] = None,
    input_file: Annotated[
        str | None,
        typer.Option(
            "--input-file", help="Read the input JSON from a file ('-': stdin).", show_default=False
        ),
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="Workflow version (default: the latest registered).")
    ] = None,
    rerun: Annotated[
        bool, typer.Option("--rerun", help="Admit a new attempt even if this job already ran.")
    ] = False,
    if_exists: Annotated[
        IfExists,
        typer.Option(
            "--if-exists",
            help="When the job already has a run with other input: admit a new run (new), "
            "give back the job's latest run (reuse), or refuse (error).",
        ),
    ] = IfExists.NEW,
    as_json: JsonOption = False,
) -> None:
    """Admit a run of WORKFLOW. The same job, input and version give back the same run."""
    value = read_input(input_json, input_file)
    with open_app(app, None, hint=APP_HINT) as loaded:
        row = loaded.submit(
            workflow,
            job_id=job_id,
            input=value,
            version=version,
            rerun=rerun,
            if_exists=if_exists.value,
        )
    if as_json:
        keys = ("run_id", "job_id", "workflow", "workflow_version", "attempt", "status")
        typer.echo(
            render.to_json(
                {"created": row.created, **{k: row[k] for k in keys}, "other_runs": row.other_runs}
            )
        )
        return
    for line in render.submitted_lines(row):
        say(line)


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
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs, newest first.")] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many runs first.")] = 0,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """List runs, newest first."""
    with open_app(app, db) as loaded:
        rows = loaded.list_runs(
            status=status.value if status else None,
            workflow=workflow,
            job_id=job_id,
            limit=limit,
            offset=offset,
        )
    _listing(rows, as_json, render.runs_table, "no runs match")


@runs_cli.command("show")
@guarded
def runs_show(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run's id.")],
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Show one run: lifecycle, lease, timeline, effects, waits and artifacts."""
    with open_app(app, db) as loaded:
        details = loaded.get_run(run_id)
    if as_json:
        typer.echo(render.to_json(render.details_json(details)))
    else:
        out().print(render.run_view(details))


def _decide(
    run_id: str,
    decision: str,
    by: str | None,
    comment: str | None,
    wait_id: str | None,
    action_id: str | None,
    app: str | None,
    db: str | None,
    *,
    result: Any = None,
) -> None:
    want = "effect" if decision in ("performed", "not_performed") else "approval"
    by = by or login()
    with open_app(app, db) as loaded:
        details = loaded.get_run(run_id)
        wait_id = check_kind(details, wait_id, decision)
        common: dict[str, Any] = {
            "by": by,
            "comment": comment,
            "wait_id": wait_id,
            "action_id": action_id,
            "channel": "cli",
            # `--by` is what the caller typed; the login is who ran the command.
            "principal": f"login:{login()}",
        }
        if want == "effect":
            outcome = loaded.resolve_effect(
                run_id, performed=decision == "performed", result=result, **common
            )
        elif decision == "approved":
            outcome = loaded.approve(run_id, **common)
        else:
            outcome = loaded.reject(run_id, **common)
    wait = outcome.wait
    if outcome.recorded:
        label = decision.replace("_", " ")
        say(
            f"recorded: {label} by {by} on wait {wait['wait_id']} ({wait['name']}) of run "
            f"{run_id}; a worker resumes the run"
        )
    elif wait["decision"] == decision:
        say(decided_line(wait) + "; this call changed nothing")
    else:
        fail(f"not {decision.replace('_', ' ')}: {decided_line(wait)} (the first decision wins)")


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


def _verdict_command(decision: str, verb: str) -> Callable[..., None]:
    # approve and reject take the same options and differ only in the verdict they record.
    def command(
        run_id: RunArgument,
        by: ByOption = None,
        comment: CommentOption = None,
        wait_id: WaitOption = None,
        action_id: ActionOption = None,
        app: AppOption = None,
        db: DbOption = None,
    ) -> None:
        _decide(run_id, decision, by, comment, wait_id, action_id, app, db)

    command.__name__ = command.__qualname__ = verb.lower()
    command.__doc__ = (
        f"{verb} the run's pending approval. The first decision wins; repeats change nothing."
    )
    return command


approve = cli.command("approve")(guarded(_verdict_command("approved", "Approve")))
reject = cli.command("reject")(guarded(_verdict_command("rejected", "Reject")))


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


@cli.command("resolve-effect")
@guarded
def resolve_effect(
    run_id: RunArgument,
    performed: Annotated[
        bool,
        typer.Option(
            "--performed/--not-performed",
            help="Whether the in-doubt effect reached the provider (check there first).",
            show_default=False,
        ),
    ],
    result: Annotated[
        str | None,
        typer.Option(help="With --performed: the effect's result as JSON.", show_default=False),
    ] = None,
    by: ByOption = None,
    comment: CommentOption = None,
    wait_id: WaitOption = None,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Settle an in-doubt effect: --performed (never redo it) or --not-performed (do it once)."""
    value = None
    if result is not None:
        if not performed:
            fail("--result only goes with --performed", BAD_USAGE)
        try:
            value = json.loads(result)
        except json.JSONDecodeError as exc:
            fail(f"--result is not valid JSON: {exc.msg} at column {exc.colno}", BAD_USAGE)
    decision = "performed" if performed else "not_performed"
    _decide(run_id, decision, by, comment, wait_id, None, app, db, result=value)


@cli.command()
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


@guarded
def resume(
    run_id: RunArgument, by: ByOption = None, app: AppOption = None, db: DbOption = None
) -> None:
    """Resume a failed run from its last checkpoint, with its ledger: effects it recorded are
    not performed again (unlike `keel submit --rerun`, which starts a new run)."""
    with open_app(app, db) as loaded:
        loaded.resume(run_id, by=by or login())
    say(f"resumed run {run_id}: queued; a worker continues it from its last checkpoint")


@cli.command()
@guarded
def workers(as_json: JsonOption = False, app: AppOption = None, db: DbOption = None) -> None:
    """List workers (host, pid, concurrency, workflows, last heartbeat, state) and stranded runs;
    `silent` workers (not stopped, quiet for up to an hour) wait for their database or are dead."""
    with open_app(app, db) as loaded:
        rows, stranded = loaded.workers(silent_for=3600), loaded.stranded_runs()
    _listing(rows, as_json, render.workers_table, "no live workers (and none silent)")
    if as_json:
        return
    for run in stranded:
        say(
            f"stranded: run {run['run_id']} ({run['status']}) needs "
            f"{run['workflow']}@{run['workflow_version']}, which no worker serves"
        )


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
    _listing(rows, as_json, functools.partial(render.waits_table, across=True), "no open waits")


runs_cli.command("cancel")(cancel)
cli.command("chaos")(bad_spec_is_usage(observe.logged(chaos_command)))


@cli.command()
@guarded
def prune(
    older_than: Annotated[
        str, typer.Option("--older-than", help="Finished more than this long ago: 30d, 12h, 90m.")
    ],
    status: Annotated[
        list[str] | None,
        typer.Option(
            help="Only runs in this finished status (repeatable; default: completed, failed, "
            "cancelled).",
            show_default=False,
        ),
    ] = None,
    keep_failed: Annotated[
        bool, typer.Option("--keep-failed", help="Keep failed runs (they can still be resumed).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say which runs would be pruned.")
    ] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Runs deleted per transaction.")] = 200,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Delete finished runs with their checkpoints, ledger, waits, outbox, timeline and files."""
    with open_app(app, db) as loaded:
        report = loaded.prune(
            older_than=older_than,
            statuses=status,
            keep_failed=keep_failed,
            dry_run=dry_run,
            batch_size=batch_size,
        )
    if as_json:
        typer.echo(render.to_json(dataclasses.asdict(report)))
    else:
        observe.print_prune(report)


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


runs_cli.command("resume")(resume)
cli.command("chaos")(bad_spec_is_usage(chaos_command))


def main() -> None:
    cli(prog_name="keel")
