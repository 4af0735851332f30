"""A Keel run as the Agent Server protocol's run, and what the runs endpoints do to the store:
find a thread's run, delete a finished one, roll one back, drop a stateless run's thread."""

from __future__ import annotations

import logging
from typing import Any

from keel.core import runs as core_runs
from keel.core.errors import KeelError, RunFinished, RunNotFound, ThreadNotFound
from keel.core.ids import validate_run_id
from keel.core.lifecycle import FINISHED, Status, TerminationReason
from keel.core.store.base import Row
from keel.core.threads import validate_thread_id
from keel.runtime.aio import AsyncApp
from keel.service.agent_server.run_bodies import KWARGS
from keel.service.agent_server.shapes import fields_of, run_shape

log = logging.getLogger("keel.service")


def protocol_run(row: Row) -> dict[str, Any]:
    """A Keel run as this protocol's run, with the options it was created with: what the
    endpoints answer and a completion webhook's body (keel.runtime.webhooks)."""
    body = run_shape(row)
    kwargs = body["kwargs"]
    kept = kwargs["config"].pop(KWARGS, None) or {}
    kwargs.update(
        {
            "stream_mode": ["values"],
            "context": kwargs.get("context") or {},
            "interrupt_before": None,
            "interrupt_after": None,
            "webhook": None,
            "feedback_keys": None,
            "resumable": True,  # every Keel stream resumes by event id
            "checkpoint_during": True,  # every step's checkpoint commits with its writes
            **kept,
        }
    )
    body["assistant_id"] = body["metadata"].get("assistant_id") or body["assistant_id"]
    configurable = kwargs["config"].setdefault("configurable", {})
    configurable.update(run_id=row["run_id"], thread_id=body["thread_id"])
    body.setdefault("langsmith_session_name", None)
    return body


RUN_FIELDS = fields_of(
    protocol_run,
    {"run_id": "", "workflow": "", "status": Status.QUEUED, "created_at": 0, "updated_at": 0},
)


async def delete_thread_after(app: AsyncApp, run_id: str, thread_id: str, *, wait: bool) -> None:
    """Delete a stateless run's thread once the run finished (a paused one keeps it)."""
    row = await app.wait(run_id) if wait else await app.runtime.store.get_run(run_id)
    if row is None or Status(row["status"]) not in FINISHED:
        return
    try:
        await app.delete_thread(thread_id)
    except KeelError as exc:
        log.info("thread %s of stateless run %s kept: %s", thread_id, run_id, exc)


async def run_of_thread(app: AsyncApp, thread_id: str, run_id: str, *, thread: bool) -> Row:
    """The run's row if it is one of the thread's (and, with `thread`, the thread exists)."""
    await app.open()
    validate_thread_id(thread_id)
    validate_run_id(run_id)
    store = app.runtime.store
    found = await store.get_thread(thread_id)
    if thread and found is None:
        raise ThreadNotFound(f"no thread {thread_id!r}")
    row = await store.get_run(run_id)
    if (
        row is None
        or (row.get("thread_id") or row["run_id"]) != thread_id
        # A run of a deleted thread of that id, not of the thread made again (migration 0035).
        or (found is not None and int(row["thread_seq"] or 0) < int(found["first_seq"]))
    ):
        raise RunNotFound(f"thread {thread_id} has no run {run_id!r}")
    return row


async def delete_finished_run(app: AsyncApp, thread_id: str, run_id: str) -> dict[str, int] | None:
    await app.open()
    return await app.runtime.store.delete_finished_run(thread_id, run_id)


async def roll_back(app: AsyncApp, run_id: str, by: str) -> Row:
    """Cancel the run as a rollback: it ends `rolled_back` and what it checkpointed goes (a
    running one's at its next step boundary, as a `rollback` strategy's does)."""
    await app.open()
    store = app.runtime.store
    async with store.transaction() as tx:
        run = await store.lock_run(tx, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        if Status(run["status"]) in FINISHED:
            raise RunFinished(f"run {run_id} is already {run['status']}")
        await core_runs.stop(store, tx, run, TerminationReason.ROLLED_BACK, {"by": by})
        if run["status"] != Status.RUNNING and run.get("thread_id"):
            await store.discard_rolled_back(tx, str(run["thread_id"]))
        row = await store.read_run(tx, run_id)
    assert row is not None
    return row
