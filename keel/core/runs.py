"""Admission and lifecycle transitions: the Python side of a run's status.

A run's status is written only by the store's statements that declare their moves in a
`-- moves:` header of queries.sql (tests/unit/test_state_machine.py holds every header against
the transition table in `keel.core.lifecycle`, and finds the writers by their SQL, so a new one
cannot go undeclared); each records the move on the run's timeline in the same transaction:

- `insert_run` and `admit_run`: admission (`admit` here), a new run queued; `insert_thread_run`:
  a run admitted at its place on a thread (`keel.core.threads.admit`);
- `schedule_fire_runs`: the runs of a batch of schedules' due ticks admitted, queued
  (`keel.core.schedule_firing`);
- `claim_next`: the claim (`keel.core.leases.claim`), queued or running under an expired lease
  to running, with the lease, so no reader ever sees a running run without an owner;
- `update_run_status`: `transition()` here, every move made inside a transaction of Python
  (a cancel, a resume, a lease given back, a deadline's policy, a failed attempt); the store
  refuses a move its header does not declare;
- `finish_run`: `finish()` here, an execution's end, one fenced statement;
- `end_registration`: the end of a wait registration (`keel.core.waits.register`), running to
  waiting, queued (a decision raced it) or cancelled;
- `decide`: a decision (`keel.core.decisions.decide`), a waiting run queued.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from keel.core.codec import canonical_json, check_storable, loads
from keel.core.errors import (
    InputTooLarge,
    InvalidTransition,
    JobExists,
    RunFinished,
    RunNotFound,
    UsageError,
)
from keel.core.ids import input_hash, run_id, validate_job_id
from keel.core.lifecycle import FINISHED, Status, TerminationReason, check_transition
from keel.core.store.base import EndWith, Later, Row, Tx
from keel.core.store.run_queries import NewRun
from keel.core.store.store import Store
from keel.core.wait_model import ExpiryDecision, WaitStatus

IF_EXISTS = ("new", "reuse", "error")
"""What `submit` does when the job already has runs with other input: admit a new run (and say
so), return the job's latest run instead, or refuse (JobExists). "reuse" is the default: a job
id is an idempotency key, so a retried webhook whose payload differs (a timestamp) is the run
it admitted the first time, not a second one."""


@dataclass(frozen=True)
class Admission:
    row: Row
    created: bool
    other_runs: list[str]
    """The job's runs of this workflow with other input, newest first."""
    then: Row | None = None
    """What the `then` write that committed with the admission returned (a claim's row)."""


async def admit(
    store: Store,
    *,
    workflow: str,
    version: str,
    job_id: str,
    input: Any,
    rerun: bool,
    max_input_bytes: int,
    if_exists: str = "reuse",
    check: Callable[[Any], None] | None = None,
    then: Callable[[Tx], Awaitable[Later]] | None = None,
    delay: float | None = None,
    not_before: float | None = None,
) -> Admission:
    """Write the run before anything executes it; the same job+input+version is one run.

    `delay` (seconds from the database's now) or `not_before` (epoch seconds) delay its first
    claim (keel.core.timers); a run found already admitted keeps its own.

    `then`, a write of the same store whose row is read after the commit, is sent and
    committed with a first attempt's admission, whether that created the run or found it (a
    rerun's admission, several statements, takes none: `then` is not called).

    `check` is given the input as the graph will get it (the admitted JSON, decoded) after
    JSON's own rules and the size limit, and raises InvalidInput if the graph cannot take it."""
    validate_job_id(job_id)
    if if_exists not in IF_EXISTS:
        raise UsageError(f"if_exists must be one of {', '.join(IF_EXISTS)}, not {if_exists!r}")
    check_storable(input, "input")
    input_json = canonical_json(input)
    size = len(input_json.encode())
    if size > max_input_bytes:
        raise InputTooLarge(f"input is {size} bytes; the limit is {max_input_bytes}")
    if check is not None:
        check(loads(input_json))
    first = NewRun(
        run_id=run_id(job_id, workflow, version, input_json, 1),
        job_id=job_id,
        workflow=workflow,
        workflow_version=version,
        attempt=1,
        input_hash=input_hash(workflow, version, input_json),
        input=input_json,
        delay=delay,
        not_before=not_before,
    )
    if not rerun:
        return await _admit_once(store, first, if_exists, then)
    async with store.transaction() as tx:
        job = await store.job_runs(tx, job_id, workflow)
        others = [r["run_id"] for r in job if r["input_hash"] != first.input_hash]
        while True:
            attempt = await store.next_attempt(tx, job_id, workflow, first.input_hash)
            run = replace(
                first,
                run_id=run_id(job_id, workflow, version, input_json, attempt),
                attempt=attempt,
            )
            # A rerun racing another one for the same attempt number lost the insert (its
            # conflict waited for the winner's commit): the next number is free now.
            if await store.insert_run(tx, run):
                break
        await store.add_event(tx, run.run_id, "admitted", _admitted(run))
        await store.notify_wake(tx, run.run_id)
        row = await store.read_run(tx, run.run_id)
    assert row is not None
    return Admission(row, True, others)


def job_exists_message(job_id: str, latest: str, *, new: str, reuse: str) -> str:
    """The refusal under if_exists="error", with the two other choices in the words of the
    surface that refused (Python's keyword, the CLI's option, the HTTP body's field)."""
    return (
        f"job {job_id} already has a run with other input ({latest}); submit it with {new} "
        f"to admit another, {reuse} to get that one"
    )


async def _admit_once(
    store: Store,
    run: NewRun,
    if_exists: str,
    then: Callable[[Tx], Awaitable[Later]] | None,
) -> Admission:
    """The first attempt of a job's input, admitted (or found) in one statement."""
    row, created, refused, others, after = await store.admit_run(
        run, if_exists=if_exists, data=_admitted(run), then=then
    )
    if refused and if_exists == "error":
        message = job_exists_message(
            run.job_id, others[0], new="if_exists='new'", reuse="if_exists='reuse'"
        )
        raise JobExists(message, job_id=run.job_id, runs=others)
    if row is None:
        # Refused (reuse: the job's latest run), or admitted by a concurrent submit that
        # committed while this one waited on it: read it now.
        row = await store.get_run(others[0] if refused else run.run_id)
    assert row is not None
    return Admission(row, created, others, after)


def _admitted(run: NewRun) -> dict[str, Any]:
    return {
        "workflow": run.workflow,
        "version": run.workflow_version,
        "job_id": run.job_id,
        "attempt": run.attempt,
    }


async def transition(
    store: Store,
    tx: Tx,
    current: Row,
    target: Status,
    *,
    worker_id: str | None = None,
    token: int | None = None,
    decision: str | None = None,
    termination_reason: str | None = None,
    error: str | None = None,
    output: str | None = None,
    event: dict[str, Any] | None = None,
) -> None:
    """Move a run along the transition table and record the move on its timeline."""
    check_transition(current["status"], target)
    await store.update_run_status(
        tx,
        current["run_id"],
        current["status"],
        target.value,
        decision=decision,
        termination_reason=termination_reason,
        error=error,
        output=output,
        finished=target in FINISHED,
    )
    data = _move_data(event, termination_reason, error)
    await _record_move(store, tx, current, target, f"status.{target.value}", data, worker_id, token)


async def give_up(
    store: Store,
    tx: Tx,
    run: Row,
    data: dict[str, Any],
    *,
    error: str,
    worker_id: str,
    token: int,
) -> None:
    """End a running run failed after its last failed attempt (`data`: cause, attempt, limit,
    error), on the timeline as `attempt.failed` then the move: a crash past its limit
    (`keel.core.attempts`), a worker that died once too often (`keel.core.leases`)."""
    await store.add_event(
        tx, run["run_id"], "attempt.failed", data, worker_id=worker_id, token=token
    )
    await transition(
        store,
        tx,
        run,
        Status.FAILED,
        worker_id=worker_id,
        token=token,
        termination_reason=TerminationReason.EXECUTION_ERROR.value,
        error=error,
        event={"cause": data["cause"], "attempts": data["attempt"]},
    )


async def finish(
    store: Store,
    run_id: str,
    token: int,
    target: Status,
    *,
    worker_id: str,
    termination_reason: str | None,
    error: str | None = None,
    output: str | None = None,
    within: EndWith | None = None,
    failure: dict[str, Any] | None = None,
) -> None:
    """End the running run that `token` holds (completed, failed, cancelled) in one statement,
    its timeline event with it; LeaseLost (RunNotFound, InvalidTransition) and nothing written
    if the token no longer holds it running. A completed run without `termination_reason` ends
    for the reason its waits give (its approval verdict, or timed_out), judged in the same
    statement (the rule is the `finish_run` query's): nothing is read before it. `within`: the
    statement commits in that transaction (the saver's, with the run's last checkpoint).
    `failure` (keel.core.failures.describe) goes into a failed run's event."""
    check_transition(Status.RUNNING, target)
    if target not in FINISHED:
        raise InvalidTransition(f"finish() ends a run; {target.value} is not an end")
    if termination_reason is None and target != Status.COMPLETED:
        raise InvalidTransition(f"a run that ends {target.value} says why")
    moved: dict[str, Any] = {"from": Status.RUNNING.value, "to": target.value}
    moved.update(_move_data(None, termination_reason, error))
    if failure is not None:
        moved["failure"] = failure  # keel.core.failures: where, and the traceback
    done = await store.finish_run(
        run_id,
        token,
        target.value,
        worker_id=worker_id,
        termination_reason=termination_reason,
        error=error,
        output=output,
        kind=f"status.{target.value}",
        data=moved,
        within=within,
    )
    if done:
        return
    # Why not: the same errors a fenced transaction raises, or the run had moved on.
    current = await store.check_token(run_id, token)
    check_transition(current["status"], target)
    raise InvalidTransition(f"run {run_id} is {current['status']}, not running")


def _move_data(
    event: dict[str, Any] | None, termination_reason: str | None, error: str | None
) -> dict[str, Any]:
    data = dict(event or {})
    if termination_reason:
        data["termination_reason"] = termination_reason
    if error:
        data["error"] = error[:2000]
    return data


async def _record_move(
    store: Store,
    tx: Tx,
    current: Row,
    target: Status,
    kind: str,
    data: dict[str, Any],
    worker_id: str | None,
    token: int | None,
    ids: dict[str, Any] | None = None,
) -> None:
    moved = {"from": current["status"], "to": target.value, **data}
    await store.add_event(
        tx, current["run_id"], kind, moved, worker_id=worker_id, token=token, ids=ids
    )


async def wake_after_wait(
    store: Store,
    tx: Tx,
    run: Row,
    *,
    decision: str | None,
    cause: dict[str, Any],
) -> None:
    """A wait was answered: record the run's decision and queue it to resume if it waits."""
    if decision is not None:
        await store.set_run_decision(tx, run["run_id"], decision)
    if run["status"] == Status.WAITING:
        await transition(store, tx, run, Status.QUEUED, event=cause)
    await store.notify_wake(tx, run["run_id"])


async def cancel_waits(store: Store, tx: Tx, run_id: str) -> None:
    """End the run's pending waits as cancelled: nobody is asked any more."""
    for wait in await store.read_waits(tx, run_id):
        if wait["status"] == WaitStatus.PENDING:
            await store.expire_wait(tx, wait["wait_id"], ExpiryDecision.CANCELLED, "null")


async def cancel(store: Store, run_id: str, *, by: str | None) -> Row:
    """Cancel a run: at once if it is queued or waiting, at its next step boundary if running."""
    async with store.transaction() as tx:
        # Locked: a claim committing meanwhile must not be overwritten by a stale "queued".
        run = await store.lock_run(tx, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        status = Status(run["status"])
        if status in FINISHED:
            raise RunFinished(f"run {run_id} is already {status.value}")
        await stop(store, tx, run, TerminationReason.CANCELLED, {"by": by})
        row = await store.read_run(tx, run_id)
    assert row is not None
    return row


async def stop(
    store: Store, tx: Tx, run: Row, reason: TerminationReason, event: dict[str, Any]
) -> None:
    """End an unfinished run, locked in `tx`, as cancelled for `reason`: at once if it is
    queued or waiting (its open waits expire), at its next step boundary if running (its end
    records `reason`: `finish_run` reads it from `cancel_reason`)."""
    run_id = str(run["run_id"])
    if reason != TerminationReason.CANCELLED:
        await store.set_cancel_reason(tx, run_id, reason.value)
        event = {**event, "reason": reason.value}
    if Status(run["status"]) == Status.RUNNING:
        await store.request_cancel(tx, run_id)
        await store.add_event(tx, run_id, "cancel.requested", event)
        return
    await cancel_waits(store, tx, run_id)
    await transition(store, tx, run, Status.CANCELLED, termination_reason=reason, event=event)
