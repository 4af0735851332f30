"""Admission and lifecycle transitions: the only code that changes a run's status.

Status is written in exactly three places, all here or called from here, each checked against
the transition table (`keel.core.lifecycle`) and recorded on the timeline in the same
transaction:

- `transition()` for every move inside a transaction (the `update_run_status` query);
- `finish()` for an execution's end, one fenced statement (`finish_run`);
- the claim (`Store.claim_next`, called by `keel.core.leases.claim`), one statement that takes
  the lease, sets `running` and writes the claim's event, so that no reader ever sees a running
  run without an owner.

Admission (`insert_run`) writes a new run's first status, `queued`; nothing else does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from keel.core.codec import canonical_json, loads
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
from keel.core.store.store import Store
from keel.core.wait_model import ExpiryDecision, WaitStatus

IF_EXISTS = ("new", "reuse", "error")
"""What `submit` does when the job already has runs with other input: admit a new run (and say
so), return the job's latest run instead, or refuse (JobExists)."""


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
    if_exists: str = "new",
    check: Callable[[Any], None] | None = None,
    then: Callable[[Tx], Awaitable[Later]] | None = None,
) -> Admission:
    """Write the run before anything executes it; the same job+input+version is one run.

    `then`, a write of the same store whose row is read after the commit, is sent and
    committed with a first attempt's admission, whether that created the run or found it (a
    rerun's admission, several statements, takes none: `then` is not called).

    `check` is given the input as the graph will get it (the admitted JSON, decoded) after
    JSON's own rules and the size limit, and raises InvalidInput if the graph cannot take it."""
    validate_job_id(job_id)
    if if_exists not in IF_EXISTS:
        raise UsageError(f"if_exists must be one of {', '.join(IF_EXISTS)}, not {if_exists!r}")
    input_json = canonical_json(input)
    size = len(input_json.encode())
    if size > max_input_bytes:
        raise InputTooLarge(f"input is {size} bytes; the limit is {max_input_bytes}")
    if check is not None:
        check(loads(input_json))
    content = input_hash(workflow, version, input_json)
    if not rerun:
        return await _admit_once(
            store, workflow, version, job_id, input_json, content, if_exists, then
        )
    async with store.transaction() as tx:
        job = await store.job_runs(tx, job_id, workflow)
        others = [r["run_id"] for r in job if r["input_hash"] != content]
        while True:
            attempt = await store.next_attempt(tx, job_id, workflow, content)
            rid = run_id(job_id, workflow, version, input_json, attempt)
            inserted = await store.insert_run(
                tx,
                run_id=rid,
                job_id=job_id,
                workflow=workflow,
                version=version,
                attempt=attempt,
                input_hash=content,
                input_json=input_json,
            )
            # A rerun racing another one for the same attempt number lost the insert (its
            # conflict waited for the winner's commit): the next number is free now.
            if inserted:
                break
        await store.add_event(tx, rid, "admitted", _admitted(workflow, version, job_id, attempt))
        await store.notify_wake(tx, rid)
        row = await store.read_run(tx, rid)
    assert row is not None
    return Admission(row, True, others)


async def _admit_once(
    store: Store,
    workflow: str,
    version: str,
    job_id: str,
    input_json: str,
    content: str,
    if_exists: str,
    then: Callable[[Tx], Awaitable[Later]] | None,
) -> Admission:
    """The first attempt of a job's input, admitted (or found) in one statement."""
    rid = run_id(job_id, workflow, version, input_json, 1)
    row, created, refused, others, after = await store.admit_run(
        run_id=rid,
        job_id=job_id,
        workflow=workflow,
        version=version,
        attempt=1,
        input_hash=content,
        input_json=input_json,
        if_exists=if_exists,
        data=_admitted(workflow, version, job_id, 1),
        then=then,
    )
    if refused and if_exists == "error":
        raise JobExists(
            f"job {job_id} already has a run with other input ({others[0]}); "
            "submit it with if_exists='new' to admit another, 'reuse' to get that one",
            runs=others,
        )
    if refused:  # reuse: the job's latest run
        rid = others[0]
    if row is None:
        # Refused, or admitted by a concurrent submit that committed while this one waited on
        # it: read it now.
        row = await store.get_run(rid)
    assert row is not None
    return Admission(row, created, others, after)


def _admitted(workflow: str, version: str, job_id: str, attempt: int) -> dict[str, Any]:
    return {"workflow": workflow, "version": version, "job_id": job_id, "attempt": attempt}


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
        target.value,
        decision=decision,
        termination_reason=termination_reason,
        error=error,
        output=output,
        finished=target in FINISHED,
    )
    data = _move_data(event, termination_reason, error)
    await _record_move(store, tx, current, target, f"status.{target.value}", data, worker_id, token)


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
) -> None:
    """End the running run that `token` holds (completed, failed, cancelled) in one statement,
    its timeline event with it; LeaseLost (RunNotFound, InvalidTransition) and nothing written
    if the token no longer holds it running. A completed run without `termination_reason` ends
    for the reason its waits give (its approval verdict, or timed_out), judged in the same
    statement (the rule is the `finish_run` query's): nothing is read before it. `within`: the
    statement commits in that transaction (the saver's, with the run's last checkpoint)."""
    check_transition(Status.RUNNING, target)
    if target not in FINISHED:
        raise InvalidTransition(f"finish() ends a run; {target.value} is not an end")
    if termination_reason is None and target != Status.COMPLETED:
        raise InvalidTransition(f"a run that ends {target.value} says why")
    moved = {"from": Status.RUNNING.value, "to": target.value}
    moved.update(_move_data(None, termination_reason, error))
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
        if status == Status.RUNNING:
            await store.request_cancel(tx, run_id)
            await store.add_event(tx, run_id, "cancel.requested", {"by": by})
        else:
            await cancel_waits(store, tx, run_id)
            await transition(
                store,
                tx,
                run,
                Status.CANCELLED,
                termination_reason=TerminationReason.CANCELLED,
                event={"by": by},
            )
        row = await store.read_run(tx, run_id)
    assert row is not None
    return row
