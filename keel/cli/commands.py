"""The `keel` command: migrate, submit, run workers, inspect runs, decide waits (the deciding
commands in keel.cli.decide).

Every command reaches its database through `--app MODULE:ATTR` (a keel.App; $KEEL_APP) or
`--db URL` ($KEEL_DATABASE_URL), defaulting to the App default `sqlite:///.keel/keel.db`.
Keel's own errors become one red line on stderr and a non-zero exit: 2 for bad usage or input,
1 for everything else. See docs/cli.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from pathlib import Path
from typing import Annotated

import typer

from keel.chaos.command import chaos as chaos_command
from keel.cli import observe, render
from keel.cli.audit import audit_command
from keel.cli.decide import approve, reject, resolve_effect
from keel.cli.dev import (
    PROJECT_HINT,
    ConfigOption,
    CorsOption,
    ProjectDbOption,
    chosen_app,
    dev,
    serve_with_workers,
)
from keel.cli.effects import dispatcher, effects_cli
from keel.cli.guard import (
    APP_HINT,
    IfExists,
    bad_spec_is_usage,
    check_database,
    fail,
    guarded,
    read_input,
    say,
)
from keel.cli.options import (
    AfterOption,
    AppOption,
    DbOption,
    JsonOption,
    listing,
    open_app,
)
from keel.cli.runs import approvals_cli, cancel, runs_cli
from keel.cli.schedules import schedules_cli
from keel.cli.threads import threads_cli
from keel.cli.versions import versions_cli
from keel.runtime.upkeep import collect_less_often
from keel.runtime.worker import DEFAULT_CONCURRENCY

cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Crash-safe LangGraph runs.",
    # A traceback's locals could show a database password.
    pretty_exceptions_show_locals=False,
)
cli.add_typer(runs_cli, name="runs")
cli.add_typer(threads_cli, name="threads")
cli.add_typer(schedules_cli, name="schedules")
cli.add_typer(approvals_cli, name="approvals")
cli.add_typer(effects_cli, name="effects")
cli.add_typer(versions_cli, name="versions")
cli.command()(dispatcher)


@cli.callback()
def root() -> None:
    """Keel: admitted, resumable LangGraph runs whose side effects happen once."""


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
    app: str | None = typer.Argument(
        None, help="MODULE:ATTRIBUTE of a keel.App (or --config).", show_default=False
    ),
    config: ConfigOption = None,
    db: ProjectDbOption = None,
    concurrency: int = typer.Option(DEFAULT_CONCURRENCY, min=1, help="Runs executed at once."),
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
        help="Also prune finished runs older than this (30d, 12h), at start and every "
        "--prune-every.",
    ),
    prune_every: str = typer.Option(
        "1h", help="How often --prune-older-than prunes (1h, 15m, seconds)."
    ),
    max_clock_skew: float | None = typer.Option(
        None,
        min=0,
        help="Refuse to start when this host's clock is further than this many seconds from "
        "the database's (default $KEEL_MAX_CLOCK_SKEW, else 300; 0: no limit).",
    ),
) -> None:
    """Execute runs of APP's workflows (or a langgraph.json project's graphs) until stopped
    (SIGTERM drains; twice stops now)."""
    loaded = chosen_app(app, config, db)
    collect_less_often()  # this process only runs the worker (and its app's imports are done)
    try:
        check_database(loaded, hint=APP_HINT if config is None else PROJECT_HINT)
        if metrics_port is not None:
            from keel.service.metrics import metrics_for

            metrics_for(loaded).serve(metrics_port, metrics_host)
        stats = loaded.run_worker(
            concurrency=concurrency,
            stop_when_idle=stop_when_idle,
            grace=grace,
            prune_older_than=prune_older_than,
            prune_every=prune_every,
            max_clock_skew=max_clock_skew,
        )
    finally:
        loaded.close()
    typer.echo(f"worker stopped: {stats}")


UVICORN_STARTUP_FAILURE = 3


@cli.command()
@guarded
@observe.logged
def serve(
    app: Annotated[
        str | None,
        typer.Argument(help="MODULE:ATTRIBUTE of a keel.App (or --config).", show_default=False),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    header_timeout: Annotated[
        str | None,
        typer.Option(
            help="Cut off a request whose headers take longer (default 10s; "
            "env: KEEL_HTTP_HEADER_TIMEOUT).",
            show_default=False,
        ),
    ] = None,
    body_timeout: Annotated[
        str | None,
        typer.Option(
            help="Cut off a request whose body takes longer (default 30s; "
            "env: KEEL_HTTP_BODY_TIMEOUT).",
            show_default=False,
        ),
    ] = None,
    config: ConfigOption = None,
    db: ProjectDbOption = None,
    cors_origin: CorsOption = None,
) -> None:
    """Serve APP's HTTP API (runs, approvals, health) until SIGINT/SIGTERM; see docs/http.md.

    Requests only record and wake: run workers separately (`keel worker APP`). Bearer tokens
    come from $KEEL_API_TOKENS, the Slack signing secret from $KEEL_SLACK_SIGNING_SECRET.
    """
    from keel.service.server import serve as serve_http

    loaded = chosen_app(app, config, db)
    if config is not None:  # a langgraph.json project (docs/projects.md)
        check_database(loaded, hint=PROJECT_HINT)
        serve_with_workers(
            loaded,
            host=host,
            port=port,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            cors_origins=cors_origin or None,
        )
        return
    assert app is not None
    check_database(loaded, hint=APP_HINT)
    # Tokens are read and checked, and their absence warned of once, by create_app.
    # Given the spec, the server owns the App and closes it when uvicorn shuts down.
    try:
        serve_http(
            app,
            host=host,
            port=port,
            log_level=logging.getLevelName(logging.getLogger().level).lower(),
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            cors_origins=cors_origin or None,
        )
    except SystemExit as exc:
        if exc.code != UVICORN_STARTUP_FAILURE:
            raise
        # uvicorn exits 3 when it cannot start (a port in use): 3 is `keel replay`'s divergence.
        fail(f"cannot serve on {host}:{port}: the server did not start (its error is above)")


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
            help="When the job already has a run with other input: give back the job's latest "
            "run (reuse: a job id is an idempotency key), admit a new run (new), or refuse "
            "(error).",
        ),
    ] = IfExists.REUSE,
    after: AfterOption = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook",
            help="A URL told, signed, when the run ends (KEEL_WEBHOOK_SECRET signs it).",
            show_default=False,
        ),
    ] = None,
    webhook_on: Annotated[
        list[str] | None,
        typer.Option(
            "--webhook-on",
            help="What the webhook is sent for (repeatable): completed, failed, cancelled, "
            "timed_out, interrupted. Default: all but interrupted.",
            show_default=False,
        ),
    ] = None,
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
            after=after,
            webhook=webhook,
            webhook_on=webhook_on or None,
        )
    if as_json:
        keys: tuple[str, ...] = (
            "run_id",
            "job_id",
            "workflow",
            "workflow_version",
            "attempt",
            "status",
        )
        keys += ("not_before",)
        typer.echo(
            render.to_json(
                {"created": row.created, **{k: row[k] for k in keys}, "other_runs": row.other_runs}
            )
        )
        return
    for line in render.submitted_lines(row):
        say(line)


cli.command("approve")(approve)
cli.command("reject")(reject)
cli.command("resolve-effect")(resolve_effect)
cli.command()(cancel)


@cli.command()
@guarded
def workers(as_json: JsonOption = False, app: AppOption = None, db: DbOption = None) -> None:
    """List workers (host, pid, concurrency, workflows, last heartbeat, state) and stranded runs;
    `silent` workers (not stopped, quiet a while) wait for their database or are dead; `dead`
    ones were quiet over three lease TTLs (shown for up to an hour)."""
    with open_app(app, db) as loaded:
        rows, stranded = loaded.workers(silent_for=3600), loaded.stranded_runs()
    listing(rows, as_json, render.workers_table, "no live workers (and none silent)")
    if as_json:
        return
    for run in stranded:
        say(f"stranded: run {run['run_id']} ({run['status']}): {run['stranded_reason']}")


# The crash harness with its own options, plus --log-level/--log-format: what its workers and
# the harness itself log (a worker inherits $KEEL_LOG_* unless --env sets them).
cli.command("chaos")(bad_spec_is_usage(observe.logged(chaos_command)))
# Before a deploy: effects, waits, versions, lease and tokens (docs/chaos.md).
cli.command("audit")(guarded(audit_command))
# A langgraph.json project served and executed by one durable process (docs/projects.md).
cli.command("dev")(guarded(observe.logged(dev)))


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


def main() -> None:
    cli(prog_name="keel")
