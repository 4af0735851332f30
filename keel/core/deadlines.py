"""Deadlines: every wait has one, and its policy is applied exactly once.

Runs whose lease expired need no sweep of their own: claiming takes them over (see leases).
Waits past their deadline are swept here, by every worker, bounded per pass; each policy is a
conditional UPDATE on the wait, so when several sweepers race only one applies it.

Policies (`on_timeout`): `reject` resumes the graph with a rejection, `timeout` resumes it with a
`timed_out` decision, `cancel` cancels the run, `fail` fails it (termination reason timed_out),
`escalate` first extends the deadline once (a `wait.escalated` event and notification to the
wait's `escalate_to`), then rejects; `wake` (a timer wait of `keel.sleep()`) resumes the run,
its deadline being its wake time. Before the deadline, a wait's schedule (`remind_after`,
`escalate_after`) sends its reminders and escalations through the outbox, each once.
"""

from __future__ import annotations

from typing import Any

from keel.core import notification_outbox
from keel.core.codec import dumps
from keel.core.lifecycle import Decision, Status, TerminationReason
from keel.core.runs import transition, wake_after_wait
from keel.core.services import Services
from keel.core.store.base import Row, Tx
from keel.core.wait_model import (
    ExpiryDecision,
    WaitKind,
    WaitStatus,
    escalation_targets,
    schedule_stages,
)

DECISION_ON_TIMEOUT = {
    "reject": ExpiryDecision.REJECTED,
    "escalate": ExpiryDecision.REJECTED,
    "timeout": ExpiryDecision.TIMED_OUT,
    "cancel": ExpiryDecision.CANCELLED,
    "fail": ExpiryDecision.TIMED_OUT,
    "wake": ExpiryDecision.WOKE,  # a timer wait (keel.core.timers): its deadline is its wake time
}


async def sweep_deadlines(services: Services, limit: int = 100) -> int:
    """Apply due reminders/escalations and the policy of each wait past its deadline;
    return how many this call applied."""
    store = services.store
    staged, expired = await store.due_waits(limit)
    applied = 0
    for wait in staged:
        async with store.transaction() as tx:
            applied += await _advance(services, tx, wait)
    for wait in expired:
        async with store.transaction() as tx:
            if await _apply(services, tx, wait):
                applied += 1
    if applied:
        services.wake()
    return applied


async def _advance(services: Services, tx: Tx, wait: Row) -> bool:
    """Deliver the wait's next reminder or escalation, once."""
    store = services.store
    schedule = schedule_stages(wait["schedule"])
    level = int(wait["escalation_level"])
    if level >= len(schedule):
        return False
    following = level + 1
    next_at = (
        float(wait["created_at"]) + float(schedule[following]["after"])
        if following < len(schedule)
        else None
    )
    row = await store.advance_stage(tx, wait["wait_id"], level, next_at)
    if row is None:  # another sweeper advanced it, or it was decided meanwhile
        return False
    stage = schedule[level]
    await store.add_event(
        tx,
        wait["run_id"],
        "wait.reminded" if stage["kind"] == "remind" else "wait.escalated",
        {"wait_id": wait["wait_id"], "level": following, "to": stage.get("to", [])},
    )
    run = await store.read_run(tx, wait["run_id"])
    assert run is not None
    await notification_outbox.record(
        services,
        tx,
        run,
        row,
        stage["kind"],
        stage=following,
        details={"to": stage.get("to", [])},
    )
    return True


async def _apply(services: Services, tx: Tx, wait: Row) -> bool:
    store = services.store
    # The run first, locked, as decisions do: one lock order, and a status that stays true.
    run = await store.lock_run(tx, wait["run_id"])
    # The wait as it is now, not as the sweep read it: a stage applied since moved its level,
    # another sweeper may have extended its deadline.
    fresh = await store.read_wait(tx, wait["wait_id"])
    # Judged by the database's clock, like the sweep's query: never this worker's.
    now = await store.db_now(tx)
    if fresh is None or fresh["status"] != WaitStatus.PENDING or not float(fresh["deadline"]) < now:
        return False
    wait = fresh
    policy = str(wait["on_timeout"])
    stages = len(schedule_stages(wait["schedule"]))
    if policy == "escalate":
        # Stages still owed (no sweep ran while they fell due: an outage, or a stage set after
        # the deadline) are delivered first, as on-time sweeps would have: the policy then
        # extends the deadline once, whichever way the sweeps fell.
        while int(wait["escalation_level"]) < stages:
            await _advance(services, tx, wait)  # False: another sweeper delivered that stage
            again = await store.read_wait(tx, wait["wait_id"])
            if again is None or again["status"] != WaitStatus.PENDING:
                return False
            wait = again
    if policy == "escalate" and int(wait["escalation_level"]) == stages:
        window = float(wait["deadline"]) - float(wait["created_at"])
        row = await store.escalate_wait(tx, wait["wait_id"], stages, max(window, 1.0))
        if row is not None:
            # To the wait's `escalate_to`, as an `escalate_after` stage escalates: not back to
            # its approvers, who let the deadline pass.
            to = escalation_targets(wait["schedule"])
            await store.add_event(
                tx,
                wait["run_id"],
                "wait.escalated",
                {"wait_id": wait["wait_id"], "level": stages + 1, "to": to},
            )
            assert run is not None
            await notification_outbox.record(
                services, tx, run, row, "escalate", stage=stages + 1, details={"to": to}
            )
        return row is not None
    decision = DECISION_ON_TIMEOUT.get(policy, ExpiryDecision.TIMED_OUT)
    value: dict[str, Any] = {
        "decision": decision,
        "wait_id": wait["wait_id"],
        "by": "keel:deadline",
        "channel": "deadline",
        "comment": f"deadline passed; policy {policy}",
        "at": now,
        "performed": False,
    }
    row = await store.expire_wait(tx, wait["wait_id"], decision, dumps(value))
    if row is None:  # a person or another sweeper got there first
        return False
    await store.add_event(
        tx,
        wait["run_id"],
        "wait.expired",
        {"wait_id": wait["wait_id"], "policy": policy, "decision": decision},
    )
    if run is None or Status(run["status"]).finished:
        return True
    if wait["kind"] != WaitKind.TIMER:  # a sleep's end is nobody's news
        await notification_outbox.record(
            services, tx, run, row, "expired", details={"policy": policy}
        )
    if policy in ("cancel", "fail") and run["status"] == Status.WAITING:
        target = Status.CANCELLED if policy == "cancel" else Status.FAILED
        reason = TerminationReason.CANCELLED if policy == "cancel" else TerminationReason.TIMED_OUT
        await transition(
            store,
            tx,
            run,
            target,
            termination_reason=reason.value,
            error=None if policy == "cancel" else f"wait {wait['wait_id']} passed its deadline",
        )
        return True
    run_decision = (
        Decision.REJECTED
        if decision == ExpiryDecision.REJECTED and wait["kind"] == WaitKind.APPROVAL
        else None
    )
    await wake_after_wait(
        store,
        tx,
        run,
        decision=run_decision,
        cause={"wait_id": wait["wait_id"], "decision": decision, "policy": policy},
    )
    return True
