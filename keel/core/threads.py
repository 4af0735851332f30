"""Threads: conversations of many runs over one checkpoint lineage, one active run at a time.

A run on a thread is admitted like any run (durably, before its first step), at the next place
of the thread's order (`thread_seq`). The database holds the rule "one active run per thread":
a run is claimable only when every run admitted before it on its thread has finished (the
`claim_next` query), and admissions on one thread are serialized by the thread's row
(`take_thread`), so the verdict of a submission's multitask strategy is taken on what every
earlier admission committed:

- `reject`: refused (ThreadBusy) while the thread has an unfinished run;
- `enqueue`: admitted behind them; it runs after them, in submission order;
- `interrupt`: every unfinished run stops (a running one at its next step boundary, its
  committed steps and effects kept) and ends cancelled, reason `interrupted`; the new run goes
  on from the thread's latest checkpoint;
- `rollback`: the same, reason `rolled_back`, and the checkpoints those runs wrote are
  discarded before the new run starts (`discard_rolled_back`); their ledgers stay, so what they
  performed is still on record, shown on the thread.

A run waiting on an interrupt is the thread's active run: a resume answers its wait (first
answer wins, as for every wait); new input follows the strategy. Unless the submission takes
LangGraph Platform's view (`end_paused`, as the Agent Server API does): there a run paused on
`interrupt()` has returned, so new input ends it (cancelled, reason
`interrupted`, its steps and checkpoints kept) and the strategy applies to the runs left.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from keel.core.codec import canonical_json, check_storable, dumps, loads
from keel.core.errors import (
    InputTooLarge,
    InvalidId,
    InvalidInput,
    JobExists,
    ThreadBusy,
    ThreadNotFound,
    UsageError,
)
from keel.core.ids import input_hash, run_id, validate_job_id
from keel.core.lifecycle import FINISHED, Status, TerminationReason
from keel.core.runs import Admission, stop
from keel.core.store.base import Later, Row, Tx
from keel.core.store.run_queries import NewRun
from keel.core.store.store import Store
from keel.core.store.thread_queries import ThreadPlace
from keel.core.wait_model import WaitKind, WaitStatus, is_interrupt_map

STRATEGIES = ("reject", "enqueue", "interrupt", "rollback")
"""What a submission on a thread with an unfinished run does (`multitask_strategy`)."""

SUPERSEDES = {
    "interrupt": TerminationReason.INTERRUPTED,
    "rollback": TerminationReason.ROLLED_BACK,
}

COMMAND_KEYS = frozenset({"resume", "update", "goto"})
KEYED_BY_INTERRUPT_ID = "keyedByInterruptId"
MAX_THREAD_ID = 128


def validate_thread_id(value: object) -> str:
    """A thread id: up to 128 of letters, digits, '.', '_', '-' (a UUID, a readable name)."""
    if not isinstance(value, str) or not value:
        raise InvalidId("thread_id must be a non-empty string")
    if len(value) > MAX_THREAD_ID:
        raise InvalidId(f"thread_id is {len(value)} characters long; the limit is {MAX_THREAD_ID}")
    if (
        not all(c.isascii() and (c.isalnum() or c in "._-") for c in value)
        or not value[0].isalnum()
    ):
        raise InvalidId(
            f"thread_id {value[:60]!r} may only contain letters, digits, '.', '_' and '-', and "
            "must start with a letter or digit"
        )
    return value


def new_id() -> str:
    """A fresh run or thread id (a UUID), for what the caller did not name."""
    return str(uuid.uuid4())


def check_config(config: Any) -> Any:
    """A run's LangGraph config as Keel applies it (`config`, or InvalidInput): an object whose
    `configurable` and `metadata` are objects and whose `tags` are strings. Another shape was
    admitted and failed every execution of the run (or every run of an assistant holding it)."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise InvalidInput("config must be an object")
    for key in ("configurable", "metadata"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise InvalidInput(f"config.{key} must be an object")
    tags = config.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise InvalidInput("config.tags must be a list of strings")
    limit = config.get("recursion_limit")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000
    ):
        raise InvalidInput("config.recursion_limit must be a whole number from 1 to 1000000")
    return config


def validate_command(command: Any) -> dict[str, Any] | None:
    """LangGraph's Command as a JSON object: `resume`, or `update` and/or `goto`."""
    if command is None:
        return None
    if not isinstance(command, dict) or not command:
        raise UsageError("command must be an object with resume, update or goto")
    command = dict(command)
    # The JS SDK's headless tools mark a resume keyed by interrupt ids (`is_interrupt_map`).
    if command.pop(KEYED_BY_INTERRUPT_ID, False) is True and not is_interrupt_map(
        command.get("resume")
    ):
        raise UsageError(
            f"{KEYED_BY_INTERRUPT_ID}: command.resume must map interrupt ids to their values"
        )
    unknown = set(command) - COMMAND_KEYS
    if unknown:
        raise UsageError(f"command takes resume, update and goto, not {', '.join(sorted(unknown))}")
    if "resume" in command and len(command) > 1:
        raise UsageError(
            "a command resumes an interrupt (resume) or starts a run with update/goto, not both: "
            "resume first, then submit the update"
        )
    goto = command.get("goto")
    if goto is not None:
        for target in goto if isinstance(goto, list) else [goto]:
            if not isinstance(target, str) and not _is_send(target):
                raise UsageError(
                    'command.goto takes node names and sends ({"node": name, "input": '
                    f"value}}), or a list of them, not {target!r:.100}"
                )
    return dict(command)


def _is_send(target: Any) -> bool:
    """A `Send` as the protocol's SDKs write it: `{"node": name, "input": value}`."""
    return (
        isinstance(target, dict)
        and set(target) <= {"node", "input"}
        and isinstance(target.get("node"), str)
    )


async def admit(
    store: Store,
    *,
    workflow: str,
    version: str,
    thread_id: str,
    create: bool,
    input: Any,
    command: dict[str, Any] | None,
    checkpoint_id: str | None,
    config: dict[str, Any] | None,
    strategy: str,
    thread_metadata: dict[str, Any] | None,
    job_id: str | None,
    max_input_bytes: int,
    check: Callable[[Any], None] | None = None,
    delay: float | None = None,
    not_before: float | None = None,
    merge_metadata: dict[str, Any] | None = None,
    then: Callable[[Tx], Awaitable[Later]] | None = None,
    end_paused: bool = False,
) -> Admission:
    """Admit a run on a thread, in one transaction under the thread's row (see the module).
    A delayed run (`delay`, `not_before`: keel.core.timers) takes its place in the thread's
    order at once; the runs after it wait for it.

    With `job_id` the submission is idempotent (the same job, input, thread and command are
    one run, and its retry is never refused by `reject`); without, each call is a new run.

    `thread_metadata` is a new thread's metadata (an existing thread keeps its own);
    `merge_metadata`'s keys are merged into the thread's, new or existing, in the same
    transaction (written only when they change it). `then`, a write of the same store (a
    claim by a worker of this process: keel.runtime.handoff), ends the transaction of a new
    run; its row is the admission's `then`."""
    if strategy not in STRATEGIES:
        raise UsageError(
            f"multitask_strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}"
        )
    validate_thread_id(thread_id)
    check_storable(input, "input")
    check_storable(command, "command")
    check_storable(config, "config")
    check_storable(thread_metadata, "metadata")
    check_storable(merge_metadata, "metadata")
    check_config(config)
    input_json = canonical_json(input)
    size = len(input_json.encode())
    if size > max_input_bytes:
        raise InputTooLarge(f"input is {size} bytes; the limit is {max_input_bytes}")
    if check is not None and input is not None:
        check(loads(input_json))
    command_json = canonical_json(command) if command is not None else None
    config_json = canonical_json(config) if config else None
    if job_id is not None:
        validate_job_id(job_id)
        identity = canonical_json([thread_id, input, command, checkpoint_id])
        rid = run_id(job_id, workflow, version, identity)
    else:
        rid = new_id()
    run = NewRun(
        run_id=rid,
        job_id=job_id or _job_of(thread_id),
        workflow=workflow,
        workflow_version=version,
        attempt=1,
        input_hash=input_hash(workflow, version, input_json),
        input=input_json,
        delay=delay,
        not_before=not_before,
    )

    # One call to the database (SQLite: on its thread, no hop per statement; committed in a
    # group with the steps committing meanwhile, one fsync for all). On PostgreSQL two round
    # trips: the thread's lock with what is read under it, then the rest with the commit.
    async def body(tx: Tx) -> Callable[[], Awaitable[Admission]]:
        taken = await store.send_take_thread(
            tx,
            thread_id,
            create=create,
            workflow=workflow,
            version=version,
            metadata=dumps(thread_metadata or {}),
        )
        # Statements of their own after the lock (each sees what earlier holders committed),
        # sent with it: the lock's round trip brings them back.
        placed = await store.thread_place(tx, thread_id)
        same_job = await store.send_read_run(tx, rid) if job_id is not None else None
        thread = await taken()
        if thread is None:
            raise ThreadNotFound(f"no thread {thread_id!r}")
        if thread["workflow"] != workflow:
            raise UsageError(
                f"thread {thread_id} belongs to workflow {thread['workflow']!r}, not {workflow!r}"
            )
        if merge_metadata and _changes(thread["metadata"], merge_metadata):
            await store.merge_thread_metadata(tx, thread_id, merge_metadata)
        if same_job is not None and job_id is not None:
            found = await same_job()
            if found is not None and int(found["thread_seq"] or 0) < int(thread["first_seq"]):
                # The same job, input and thread id, but the thread it ran on was deleted: this
                # thread of the id is another, and the old run is none of its own.
                raise JobExists(
                    f"job {job_id} ran as {rid} on a thread {thread_id} since deleted; give "
                    "this thread's run another job_id",
                    job_id=job_id,
                    runs=[rid],
                )
            if found is not None:
                existing = found

                async def already() -> Admission:
                    return Admission(existing, False, [])

                return already
        seq, unfinished = await placed()
        if unfinished and end_paused:
            unfinished = await _end_paused(store, tx, unfinished, rid)
        if unfinished and strategy == "reject":
            active = unfinished[0]
            raise ThreadBusy(
                f"thread {thread_id} has an unfinished run ({active['run_id']}, "
                f"{active['status']}); submit with multitask_strategy enqueue, interrupt or "
                "rollback, or wait for it",
                thread_id=thread_id,
                active_run=str(active["run_id"]),
            )
        if unfinished and strategy in SUPERSEDES:
            for other in unfinished:
                locked = await store.lock_run(tx, str(other["run_id"]))
                if locked is None or Status(locked["status"]) in FINISHED:
                    continue  # it ended meanwhile (a cancel, a deadline's policy)
                await stop(store, tx, locked, SUPERSEDES[strategy], {"by": f"run {rid}"})
            if strategy == "rollback":
                # What the stopped runs checkpointed goes at once (a running one's, at its end:
                # `after_stop`), so no read of the thread meanwhile sees a rolled-back state.
                await store.discard_rolled_back(tx, thread_id)
        place = ThreadPlace(
            thread_id=thread_id,
            thread_seq=seq,
            command=command_json,
            checkpoint_id=checkpoint_id,
            config=config_json,
            multitask_strategy=strategy,
        )
        await store.insert_thread_run(tx, run, place)
        await store.add_event(
            tx,
            rid,
            "admitted",
            {
                "job_id": run.job_id,
                "workflow": workflow,
                "version": version,
                "thread_id": thread_id,
                "thread_seq": place.thread_seq,
                "multitask_strategy": strategy,
                **({"checkpoint_id": checkpoint_id} if checkpoint_id else {}),
            },
        )
        await store.notify_wake(tx, rid)
        admitted = await store.send_read_run(tx, rid)
        claim = await then(tx) if then is not None else None

        async def committed() -> Admission:
            row = await admitted()
            assert row is not None
            return Admission(row, True, [], await claim() if claim is not None else None)

        return committed

    return await (await store.step_transaction(body))()


PAUSED_KINDS = frozenset({WaitKind.INTERRUPT})
"""The waits LangGraph knows: a plain `interrupt()` (or `keel.interrupt()`, one with a
deadline). A run waiting on anything else stays the thread's active run: a `keel.approval` (its
approvers, deadline and escalation are Keel's promise, not to be ended by whoever may write to
the thread), a person's word on an in-doubt effect, an outbox delivery, a timer."""


async def _end_paused(store: Store, tx: Tx, unfinished: list[Row], by: str) -> list[Row]:
    """End each of the thread's runs paused on an interrupt (see the module); the rest."""
    left = []
    for other in unfinished:
        if other["status"] != Status.WAITING:
            left.append(other)
            continue
        # The run's row first, as a decision takes it: a decision recorded meanwhile has queued
        # the run, which then goes on as an unfinished run; one that ended meanwhile is gone.
        locked = await store.lock_run(tx, str(other["run_id"]))
        if locked is None or Status(locked["status"]) in FINISHED:
            continue
        if locked["status"] == Status.WAITING:
            waits = await store.read_waits(tx, str(other["run_id"]))
            pending = [w["kind"] for w in waits if w["status"] == WaitStatus.PENDING]
            if pending and PAUSED_KINDS.issuperset(pending):
                event = {"by": f"run {by}", "paused": "new input on the thread"}
                await stop(store, tx, locked, TerminationReason.INTERRUPTED, event)
                continue
        left.append(locked)
    return left


def _changes(stored: Any, keys: dict[str, Any]) -> bool:
    """Whether merging `keys` changes a thread's metadata (`stored`: its JSON or a dict)."""
    current = loads(stored) if isinstance(stored, str) else stored
    if not isinstance(current, dict):
        return True
    return any(k not in current or current[k] != v for k, v in keys.items())


async def after_stop(store: Store, run_id: str, thread_id: str) -> None:
    """A run of a thread ended cancelled at a step boundary: if it was rolled back, what it
    checkpointed goes now, not when the thread's next run starts (which discards it too, if
    this does not happen: a crash here loses nothing)."""
    run = await store.get_run(run_id)
    if run is not None and run.get("cancel_reason") == TerminationReason.ROLLED_BACK:
        async with store.transaction() as tx:
            await store.discard_rolled_back(tx, thread_id)


def _job_of(thread_id: str) -> str:
    """The job id a run on a thread gets when none was given: the thread's, made valid."""
    lowered = thread_id.lower()
    try:
        return validate_job_id(lowered[:100])
    except InvalidId:
        return "thread"


def graph_start(run: Row) -> tuple[str, Any]:
    """What a run on a thread starts with when it has written no checkpoint yet: ("input",
    value), ("command", {update, goto}) or ("update_state", {values, as_node})."""
    command = loads(run["command"]) if run.get("command") else None
    if isinstance(command, dict) and "update_state" in command:
        return "update_state", command["update_state"]
    if command:
        return "command", command
    return "input", loads(run["input"])


def updated_after_pause(newest_first: list[Row]) -> bool:
    """Whether a thread's latest runs are a state update, completed, and before it the run it
    ended paused on a plain interrupt (`PAUSED_KINDS`)."""
    if len(newest_first) < 2:
        return False
    update, paused = newest_first[0], newest_first[1]
    return (
        update["status"] == Status.COMPLETED
        and graph_start(update)[0] == "update_state"
        and paused["status"] == Status.CANCELLED
        and paused.get("termination_reason") == TerminationReason.INTERRUPTED
    )


def run_config(run: Row) -> dict[str, Any]:
    """The configurable, context and metadata a run was submitted with."""
    config = loads(run["config"]) if run.get("config") else None
    return dict(config) if isinstance(config, dict) else {}
