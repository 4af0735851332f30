"""`keel threads ...`: conversations of many runs, in LangGraph's words (docs/cli.md, Threads).

list, create, show, copy and delete read or write the thread's rows; state and history read
its checkpoints through its workflow's graph, and create, submit and update-state need its
workflow too: those take the App (--app or $KEEL_APP). resume answers the interrupt the
thread's active run waits on; the first answer wins, a later one is refused (exit 1).
"""

from __future__ import annotations

import functools
import os
from enum import StrEnum
from typing import Annotated, NoReturn

import typer

from keel.cli import render, thread_view
from keel.cli.guard import (
    BAD_USAGE,
    fail,
    guarded,
    json_object,
    json_value,
    login,
    read_input,
    say,
)
from keel.cli.options import (
    ActionOption,
    AfterOption,
    AppOption,
    ByOption,
    CommentOption,
    DbOption,
    JsonOption,
    WaitOption,
    listing,
    metadata_filter,
    open_app,
)
from keel.cli.render import out
from keel.core.errors import ThreadBusy
from keel.core.lifecycle import Status
from keel.core.store.base import Row
from keel.runtime.app import App
from keel.runtime.snapshot_json import state_json

SHOWN_RUNS = 1000
"""The runs `keel threads show` lists: the thread's latest, in their order."""

threads_cli = typer.Typer(
    no_args_is_help=True,
    help="Threads (conversations of many runs): list, create, show, state, history, submit, "
    "resume, update-state, copy, delete.",
)


class ThreadStatus(StrEnum):
    """A thread's status, from its runs (keel.runtime.conversations.get_thread)."""

    IDLE = "idle"
    BUSY = "busy"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class Strategy(StrEnum):
    """What a submission does while the thread has an unfinished run (keel.core.threads)."""

    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


ThreadArgument = Annotated[str, typer.Argument(metavar="THREAD", help="The thread's id.")]
CheckpointOption = Annotated[
    str | None,
    typer.Option(
        "--checkpoint",
        help="A checkpoint id of the thread (`keel threads history` lists them).",
        show_default=False,
    ),
]


# -- arguments --------------------------------------------------------------------------------


def _needs_app(app: str | None, command: str, why: str) -> None:
    if not (app or os.environ.get("KEEL_APP")):
        fail(f"keel threads {command} needs --app MODULE:ATTRIBUTE, {why}", BAD_USAGE)


def _still_waiting(loaded: App, thread_id: str, timeout: float) -> NoReturn:
    """update-state's run did not end within --timeout: say why, as far as the thread tells."""
    runs = loaded.thread_runs(thread_id, newest=True)
    unfinished = (Status.QUEUED, Status.RUNNING)
    update = next(
        (
            r
            for r in runs
            if r["status"] in unfinished and thread_view.started_with(r) == "update_state"
        ),
        None,
    )
    if update is None:  # it ended just now
        fail(f"the state update did not end within {timeout:g} s; see `keel threads show`")
    rid, active = update["run_id"], loaded.active_run(thread_id)
    if active is not None and active["run_id"] != rid:
        fail(
            f"the state update (run {rid}) is queued behind run {active['run_id']} "
            f"({active['status']}) on thread {thread_id}: it runs once that run ends"
        )
    if update["status"] == Status.RUNNING:
        fail(f"the state update (run {rid}) is still running after {timeout:g} s")
    fail(
        f"the state update (run {rid}) is still queued after {timeout:g} s: a worker executes "
        "it (`keel worker APP`); it stays queued until one does"
    )


# -- commands ---------------------------------------------------------------------------------


@threads_cli.command("list")
@guarded
def threads_list(
    metadata: Annotated[
        list[str] | None,
        typer.Option(
            help="Only threads whose metadata holds KEY=VALUE (VALUE read as JSON if it is) or "
            "every key of a JSON object (repeatable).",
            show_default=False,
        ),
    ] = None,
    status: Annotated[
        ThreadStatus | None, typer.Option(help="Only threads in this status.", show_default=False)
    ] = None,
    workflow: Annotated[
        str | None, typer.Option(help="Only threads of this workflow.", show_default=False)
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=1000, help="At most this many, latest updated first.")
    ] = 50,
    offset: Annotated[int, typer.Option(min=0, help="Skip this many first.")] = 0,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """List threads, the most recently updated first, with their status and metadata."""
    wanted = metadata_filter(metadata)
    with open_app(app, db) as loaded:
        rows = loaded.search_threads(
            metadata=wanted,
            workflow=workflow,
            status=status.value if status else None,
            limit=limit,
            offset=offset,
        )
        now = loaded.database_now()
    listing(
        rows, as_json, functools.partial(thread_view.threads_table, now=now), "no threads match"
    )


@threads_cli.command("create")
@guarded
def threads_create(
    workflow: Annotated[str, typer.Argument(help="Name of a workflow registered on APP.")],
    thread_id: Annotated[
        str | None,
        typer.Option("--id", help="The thread's id (default: a new UUID).", show_default=False),
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(help="The thread's metadata, a JSON object.", show_default=False),
    ] = None,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Create an empty thread of WORKFLOW; its first run starts the conversation."""
    values = json_object(metadata, "--metadata")
    _needs_app(app, "create", "the app with the workflow")
    with open_app(app, db) as loaded:
        row = loaded.create_thread(workflow, thread_id=thread_id, metadata=values)
    if as_json:
        typer.echo(render.to_json(row))
    else:
        say(f"created thread {row['thread_id']} ({row['workflow']}@{row['workflow_version']})")


@threads_cli.command("show")
@guarded
def threads_show(
    thread_id: ThreadArgument,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Show a thread: its status and metadata, its runs in order (how each ended, its
    strategy), and what its active run waits on, with the command that answers it."""
    with open_app(app, db) as loaded:
        thread = loaded.get_thread(thread_id)
        runs = loaded.thread_runs(thread_id, SHOWN_RUNS, newest=True)[::-1]
        active = loaded.active_run(thread_id)
        waits: list[Row] = []
        if active is not None and active["status"] == Status.WAITING:
            details = loaded.get_run(str(active["run_id"]))
            waits = [w for w in details.waits if w["status"] == "pending"]
        now = loaded.database_now()
    if as_json:
        typer.echo(render.to_json(thread_view.thread_json(thread, runs, waits)))
    else:
        out().print(thread_view.view(thread, runs, waits, now))


@threads_cli.command("state")
@guarded
def threads_state(
    thread_id: ThreadArgument,
    checkpoint: CheckpointOption = None,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Print the thread's state as JSON (values, next, tasks and their interrupts, metadata,
    checkpoint): at its latest checkpoint, or at --checkpoint."""
    _needs_app(app, "state", "the app with the thread's workflow (its graph reads the state)")
    with open_app(app, db) as loaded:
        snapshot = loaded.get_state(thread_id, checkpoint)
    typer.echo(render.to_json(state_json(snapshot)))


@threads_cli.command("history")
@guarded
def threads_history(
    thread_id: ThreadArgument,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 50,
    before: Annotated[
        str | None,
        typer.Option(help="Only checkpoints older than this checkpoint id.", show_default=False),
    ] = None,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """List the thread's checkpoints, newest first: step, source, the run that wrote each,
    and what runs next (--json: each state in full)."""
    _needs_app(app, "history", "the app with the thread's workflow (its graph reads the state)")
    with open_app(app, db) as loaded:
        history = loaded.get_history(thread_id, limit=limit, before=before)
        now = loaded.database_now()
    if as_json:
        typer.echo(render.to_json([state_json(s) for s in history]))
        return
    if not history:
        say(f"thread {thread_id} has no checkpoints yet")
        return
    out().print(thread_view.history_table(thread_id, history, now))


@threads_cli.command("submit")
@guarded
def threads_submit(
    thread_id: ThreadArgument,
    workflow: Annotated[str, typer.Argument(help="Name of a workflow registered on APP.")],
    input_json: Annotated[
        str | None,
        typer.Option("--input", help="The turn's input as JSON.", show_default=False),
    ] = None,
    input_file: Annotated[
        str | None,
        typer.Option(
            "--input-file", help="Read the input JSON from a file ('-': stdin).", show_default=False
        ),
    ] = None,
    command: Annotated[
        str | None,
        typer.Option(
            "--command",
            help='Start with LangGraph\'s Command instead: {"update": ..., "goto": ...}.',
            show_default=False,
        ),
    ] = None,
    strategy: Annotated[
        Strategy,
        typer.Option(
            "--strategy",
            help="If the thread has an unfinished run: run after it (enqueue), refuse (reject), "
            "stop it and go on from its last checkpoint (interrupt), or stop it and discard its "
            "checkpoints (rollback).",
        ),
    ] = Strategy.ENQUEUE,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            "--checkpoint", help="Fork: start from this past checkpoint.", show_default=False
        ),
    ] = None,
    job_id: Annotated[
        str | None,
        typer.Option(
            "--job-id",
            help="Makes the submission idempotent: the same job, thread and input give back the "
            "same run.",
            show_default=False,
        ),
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(help="The thread's metadata if this creates it (JSON).", show_default=False),
    ] = None,
    after: AfterOption = None,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Admit a run on THREAD (created if new): a turn that starts from the thread's latest
    checkpoint and merges its input through the graph's reducers."""
    start = json_object(command, "--command")
    if start is not None and "resume" in start:
        fail("a resume answers an interrupt: use `keel threads resume THREAD VALUE`", BAD_USAGE)
    if input_json is None and input_file is None and start is None:
        fail(
            "give the run's input with --input JSON or --input-file PATH (or a --command)",
            BAD_USAGE,
        )
    value = (
        None if input_json is None and input_file is None else read_input(input_json, input_file)
    )
    thread_metadata = json_object(metadata, "--metadata")
    _needs_app(app, "submit", "the app with the workflow")
    with open_app(app, db) as loaded:
        try:
            row = loaded.submit(
                workflow,
                value,
                thread_id=thread_id,
                job_id=job_id,
                command=start,
                checkpoint_id=checkpoint,
                multitask_strategy=strategy.value,
                metadata=thread_metadata,
                after=after,
            )
        except ThreadBusy as exc:
            fail(
                f"thread {exc.thread_id} is busy: run {exc.active_run} is unfinished; submit "
                "with --strategy enqueue (run after it), interrupt or rollback (stop it), or "
                "wait for it"
            )
        active = loaded.active_run(thread_id) if row.created else None
    if as_json:
        keys: tuple[str, ...] = (
            "run_id",
            "thread_id",
            "thread_seq",
            "job_id",
            "workflow",
            "workflow_version",
        )
        keys += ("not_before",)
        fields = {k: row[k] for k in keys} | {"multitask_strategy": strategy.value}
        typer.echo(render.to_json({"created": row.created, **fields, "status": row["status"]}))
        return
    what = f"turn {row['thread_seq']}, {row['workflow']}@{row['workflow_version']}"
    if not row.created:
        say(f"already admitted: run {row.run_id} on thread {thread_id} ({what}); {row['status']}")
        return
    said = f"admitted run {row.run_id} on thread {thread_id} ({what}): queued for a worker"
    if active is not None and active["run_id"] != row.run_id:
        said += f", behind run {active['run_id']} ({active['status']})"
    elif strategy in (Strategy.INTERRUPT, Strategy.ROLLBACK):
        said += f"; unfinished runs before it are stopped ({strategy.value})"
    say(said)


@threads_cli.command("resume")
@guarded
def threads_resume(
    thread_id: ThreadArgument,
    value_json: Annotated[
        str,
        typer.Argument(
            metavar="VALUE", help="What interrupt() returns, as JSON: '\"yes\"', '{\"n\": 2}'."
        ),
    ],
    by: ByOption = None,
    comment: CommentOption = None,
    wait_id: WaitOption = None,
    action_id: ActionOption = None,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Answer the interrupt the thread's active run waits on with VALUE. The first answer wins;
    a later one changes nothing and exits 1 (0 if it repeats the winner's --action-id)."""
    value = json_value(value_json, "VALUE")
    by = by or login()
    with open_app(app, db) as loaded:
        outcome = loaded.resume_thread(
            thread_id,
            value,
            by=by,
            comment=comment,
            wait_id=wait_id,
            action_id=action_id,
            channel="cli",
            # `--by` is what the caller typed; the login is who ran the command.
            principal=f"login:{login()}",
        )
    wait = outcome.wait
    if outcome.recorded:
        say(
            f"recorded: resumed by {by} on wait {wait['wait_id']} of run {wait['run_id']} on "
            f"thread {thread_id}; a worker continues the run"
        )
    elif action_id is not None and wait.get("action_id") == action_id:
        say(f"{thread_view.answered(wait)}; the same --action-id: this call changed nothing")
    else:
        fail(f"not resumed: {thread_view.answered(wait)}; the first answer wins")


@threads_cli.command("update-state")
@guarded
def threads_update_state(
    thread_id: ThreadArgument,
    values_json: Annotated[
        str, typer.Argument(metavar="VALUES", help="The values to write, as a JSON object.")
    ],
    as_node: Annotated[
        str | None,
        typer.Option(
            "--as-node",
            help="Write them as if this node had (LangGraph's as_node).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for a worker to write them.")
    ] = 60.0,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Write VALUES to the thread's state as a new checkpoint. The update is a run of its own
    that a worker executes, after the thread's queued and running runs (on an interrupted
    thread it answers the interrupt: the waiting run ends); this waits up to --timeout."""
    values = json_value(values_json, "VALUES")
    _needs_app(app, "update-state", "the app with the thread's workflow")
    with open_app(app, db) as loaded:
        try:
            row = loaded.update_state(thread_id, values, as_node, timeout=timeout)
        except TimeoutError:
            _still_waiting(loaded, thread_id, timeout)
    if row["status"] != Status.COMPLETED:
        fail(f"the state update (run {row['run_id']}) {row['status']}: {row['error'] or '-'}")
    written = render.decoded(row).get("output") or {}
    if as_json:
        typer.echo(render.to_json({"run_id": row["run_id"], "status": row["status"], **written}))
        return
    node = f", as node {written['as_node']}" if written.get("as_node") else ""
    say(
        f"updated thread {thread_id}: checkpoint {written.get('checkpoint_id')} "
        f"(run {row['run_id']}{node})"
    )


@threads_cli.command("copy")
@guarded
def threads_copy(
    thread_id: ThreadArgument,
    to: Annotated[
        str | None,
        typer.Option("--to", help="The new thread's id (default: a new UUID).", show_default=False),
    ] = None,
    as_json: JsonOption = False,
    app: AppOption = None,
    db: DbOption = None,
) -> None:
    """Copy a thread's checkpoints (its history) to a new thread; its runs stay with it."""
    with open_app(app, db) as loaded:
        row = loaded.copy_thread(thread_id, to=to)
    if as_json:
        typer.echo(render.to_json(row))
    else:
        say(f"copied thread {thread_id} to {row['thread_id']}: its checkpoints, not its runs")


@threads_cli.command("delete")
@guarded
def threads_delete(thread_id: ThreadArgument, app: AppOption = None, db: DbOption = None) -> None:
    """Delete a thread and its checkpoints; its runs, their timelines and ledgers stay on
    record until pruned. Refused while a run on it is unfinished."""
    with open_app(app, db) as loaded:
        runs = loaded.get_thread(thread_id)["runs"]
        try:
            loaded.delete_thread(thread_id)
        except ThreadBusy as exc:
            fail(
                f"thread {thread_id} has an unfinished run ({exc.active_run}): cancel it first "
                f"(`keel cancel {exc.active_run}`)"
            )
    kept = f"; its {runs} run(s) stay on record until pruned" if runs else ""
    say(f"deleted thread {thread_id} and its checkpoints{kept}")
