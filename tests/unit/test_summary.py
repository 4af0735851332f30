"""A run's summary (keel.runtime.summary) from its rows alone: outcome, timing, takeovers."""

from __future__ import annotations

from typing import Any

from keel.runtime.runtime import RunDetails
from keel.runtime.summary import summarize


def event(
    n: int, at: float, kind: str, worker: str | None = None, token: int | None = None, **data: Any
) -> dict[str, Any]:
    return {
        "event_id": n,
        "at": at,
        "kind": kind,
        "worker_id": worker,
        "lease_token": token,
        "data": data,
    }


def run_row(**fields: Any) -> dict[str, Any]:
    row = {
        "run_id": "job-1-abc",
        "job_id": "job-1",
        "workflow": "pay",
        "workflow_version": "1",
        "status": "completed",
        "decision": "not_decided",
        "termination_reason": "completed",
        "error": None,
        "lease_owner": None,
        "lease_token": 2,
        "created_at": 100.0,
        "started_at": 101.0,
        "finished_at": 130.0,
    }
    return {**row, **fields}


def test_a_takeover_shows_as_a_second_attempt_and_each_node_gets_its_bar() -> None:
    timeline = [
        event(1, 100, "admitted"),
        event(2, 101, "lease.claimed", "w1", 1),
        event(3, 101.5, "step", "w1", 1, node="__start__"),
        event(4, 104, "step", "w1", 1, node="draft"),
        # w1 froze in `charge`; w2 took the run over after the lease expired
        event(5, 120, "lease.takeover", "w2", 2),
        event(6, 125, "effect.sent", "w2", 2),
        event(7, 126, "step", "w2", 2, node="charge"),
        event(8, 130, "status.completed", "w2", 2),
    ]
    effects = [{"status": "sent"}]
    summary = summarize(RunDetails(run_row(), timeline, effects, [], []), now=500.0)
    assert [(a.worker_id, a.lease_token, a.how, a.steps) for a in summary.attempts] == [
        ("w1", 1, "claimed", 1),
        ("w2", 2, "takeover", 1),
    ]
    assert summary.attempts[0].ended_by == "lease.takeover"
    assert [(s.label, s.start, s.end, s.worker_id) for s in summary.spans] == [
        ("draft", 101.5, 104, "w1"),
        ("charge", 120, 126, "w2"),
    ]
    assert summary.takeovers == 1 and summary.duration == 29.0
    assert summary.outcome == "completed (completed)" and summary.effects == {"sent": 1}


def test_a_waiting_run_says_who_it_waits_for_and_the_wait_is_a_bar_up_to_now() -> None:
    timeline = [
        event(1, 100, "admitted"),
        event(2, 101, "lease.claimed", "w1", 1),
        event(3, 102, "step", "w1", 1, node="review"),
        event(4, 102, "status.waiting", "w1", 1),
    ]
    wait = {
        "wait_id": "w-1",
        "kind": "approval",
        "name": "manager",
        "status": "pending",
        "payload": "{}",
        "escalation_level": 2,
    }
    run = run_row(status="waiting", termination_reason=None, finished_at=None)
    summary = summarize(RunDetails(run, timeline, [], [wait], []), now=200.0)
    assert summary.outcome == "waiting for manager"
    assert "escalated to level 2" in summary.why
    assert summary.spans[-1].kind == "waiting" and summary.spans[-1].end == 200.0
    assert summary.pending_waits == 1 and summary.duration == 99.0
