"""Resuming a failed run: the same run id continues from its last checkpoint with its ledger.

It sits above `keel.core.runs` and the effects wing because it is where the two meet: a key
left in doubt, whose wait ran out and failed the run, must ask a person again on resume.
"""

from __future__ import annotations

from typing import Any

from keel.core.effects.in_doubt import reopen_expired
from keel.core.errors import InvalidTransition, RunNotFound
from keel.core.lifecycle import Status
from keel.core.runs import transition
from keel.core.store.base import Row
from keel.core.store.store import Store


async def resume(store: Store, run_id: str, *, by: str | None) -> Row:
    """Queue a failed run again: the same run id continues from its last checkpoint with its
    ledger, so an effect recorded sent is not performed again (unlike `rerun`, a new run).

    An in-doubt effect whose wait ran out (what failed the run) asks a person again, on a new
    wait: its expired answer is counted as acted upon, never taken for one."""
    async with store.transaction() as tx:
        run = await store.lock_run(tx, run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        if run["status"] != Status.FAILED:
            raise InvalidTransition(
                f"run {run_id} is {run['status']}: only a failed run can be resumed"
                + (
                    " (a cancelled run stays cancelled; submit it with rerun)"
                    if run["status"] == Status.CANCELLED
                    else ""
                )
            )
        thread = run.get("thread_id")
        held = await store.lock_thread(tx, thread) if thread else None
        if thread and (held is None or int(held["first_seq"]) > int(run["thread_seq"])):
            # Its thread was deleted (and maybe made again under its id, with runs of its own):
            # resumed, it would run on no thread, or on another's checkpoints.
            raise InvalidTransition(
                f"run {run_id} belonged to thread {thread}, which was deleted: submit a new "
                "run instead"
            )
        if thread and await store.next_thread_seq(tx, thread) > run["thread_seq"] + 1:
            # A later turn already went on from the thread's state (or waits to): the failed
            # one resumed now would start over on top of it.
            raise InvalidTransition(
                f"run {run_id} is not the latest run of thread {run['thread_id']}: a later "
                "run goes on from the thread's state; submit a new run on the thread instead"
            )
        previous = {"termination_reason": run["termination_reason"], "error": run["error"]}
        event: dict[str, Any] = {"reason": "resumed", "by": by, "previous": previous}
        reopened = await reopen_expired(store, tx, run_id)
        if reopened:
            event["reopened_waits"] = reopened
        await transition(store, tx, run, Status.QUEUED, event=event)
        await store.clear_failure(tx, run_id)
        await store.notify_wake(tx, run_id)
        row = await store.read_run(tx, run_id)
    assert row is not None
    return row
