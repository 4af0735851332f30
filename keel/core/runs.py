"""Admission and lifecycle transitions: the only code that changes a run's status."""

from __future__ import annotations

from typing import Any

from keel.core.codec import canonical_json
from keel.core.errors import InputTooLarge, RunFinished, RunNotFound
from keel.core.ids import input_hash, run_id, validate_job_id
from keel.core.lifecycle import FINISHED, Status, check_transition
from keel.core.store.base import Row, Tx
from keel.core.store.store import Store


async def admit(
    store: Store,
    *,
    workflow: str,
    version: str,
    job_id: str,
    input: Any,
    now: float,
    rerun: bool,
    max_input_bytes: int,
) -> tuple[Row, bool]:
    """Write the run before anything executes it; the same job+input+version is one run."""
    validate_job_id(job_id)
    input_json = canonical_json(input)
    size = len(input_json.encode())
    if size > max_input_bytes:
        raise InputTooLarge(f"input is {size} bytes; the limit is {max_input_bytes}")
    content = input_hash(workflow, version, input_json)
    async with store.db.transaction() as tx:
        attempt = 1
        if rerun:
            row = await tx.one(
                "max_attempt", {"job_id": job_id, "workflow": workflow, "input_hash": content}
            )
            attempt = int(row["attempt"]) + 1 if row else 1
        rid = run_id(job_id, workflow, version, input_json, attempt)
        inserted = await tx.one(
            "insert_run",
            {
                "run_id": rid,
                "job_id": job_id,
                "workflow": workflow,
                "workflow_version": version,
                "attempt": attempt,
                "input_hash": content,
                "input": input_json,
                "now": now,
            },
        )
        if inserted is not None:
            await store.add_event(
                tx,
                rid,
                "admitted",
                now,
                {"workflow": workflow, "version": version, "job_id": job_id, "attempt": attempt},
            )
            await tx.one("notify_wake", {"run_id": rid})
        row = await tx.one("get_run", {"run_id": rid})
    assert row is not None
    return row, inserted is not None


async def transition(
    store: Store,
    tx: Tx,
    current: Row,
    target: Status,
    now: float,
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
    await tx.execute(
        "update_run_status",
        {
            "run_id": current["run_id"],
            "status": target.value,
            "decision": decision,
            "termination_reason": termination_reason,
            "error": error,
            "output": output,
            "finished_at": now if target in FINISHED else None,
            "now": now,
        },
    )
    data = {"from": current["status"], "to": target.value, **(event or {})}
    if termination_reason:
        data["termination_reason"] = termination_reason
    if error:
        data["error"] = error[:2000]
    await store.add_event(
        tx, current["run_id"], f"status.{target.value}", now, data, worker_id=worker_id, token=token
    )


async def wake_after_wait(
    store: Store,
    tx: Tx,
    run: Row,
    now: float,
    *,
    decision: str | None,
    cause: dict[str, Any],
) -> None:
    """A wait was answered: record the run's decision and queue it to resume if it waits."""
    if decision is not None:
        await tx.execute(
            "set_run_decision", {"run_id": run["run_id"], "decision": decision, "now": now}
        )
    if run["status"] == Status.WAITING:
        await transition(store, tx, run, Status.QUEUED, now, event=cause)
    await tx.one("notify_wake", {"run_id": run["run_id"]})


async def cancel(store: Store, run_id: str, now: float, *, by: str | None) -> Row:
    """Cancel a run: at once if it is queued or waiting, at its next step boundary if running."""
    async with store.db.transaction() as tx:
        # Locked: a claim committing meanwhile must not be overwritten by a stale "queued".
        run = await tx.one("lock_run", {"run_id": run_id})
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        status = Status(run["status"])
        if status in FINISHED:
            raise RunFinished(f"run {run_id} is already {status.value}")
        if status == Status.RUNNING:
            await tx.execute("set_cancel_requested", {"run_id": run_id, "now": now})
            await store.add_event(tx, run_id, "cancel.requested", now, {"by": by})
        else:
            for wait in await tx.all("list_waits", {"run_id": run_id}):
                if wait["status"] == "pending":
                    await tx.one(
                        "expire_wait",
                        {
                            "wait_id": wait["wait_id"],
                            "decision": "cancelled",
                            "value": "null",
                            "now": now,
                        },
                    )
            await transition(
                store,
                tx,
                run,
                Status.CANCELLED,
                now,
                termination_reason="cancelled",
                event={"by": by},
            )
        row = await tx.one("get_run", {"run_id": run_id})
    assert row is not None
    return row
