"""A run's summary (keel.runtime.summary) from its rows alone: outcome, timing, takeovers."""

from __future__ import annotations

from typing import Any

from keel.runtime.runtime import RunDetails
from keel.runtime.summary import seconds_text, summarize


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


def test_time_splits_four_ways_per_node_and_crashes_and_resumes_are_marked_where_seen() -> None:
    timeline = [
        event(1, 100, "admitted"),
        event(2, 110, "lease.claimed", "w1", 1),  # queued 10 s
        event(3, 111, "step", "w1", 1, node="__start__"),
        event(4, 115, "step", "w1", 1, node="draft"),  # draft ran 4 s
        event(5, 116, "attempt.crashed", "w1", 1, attempt=1, limit=3, error="Boom: in send"),
        event(6, 140, "lease.takeover", "w2", 2),  # 25 s lost since draft's write
        event(7, 150, "step", "w2", 2, node="send"),  # send ran 10 s
        event(8, 151, "step", "w2", 2, node="review", writes=["__interrupt__"]),
        event(9, 151, "status.waiting", "w2", 2),
        event(10, 451, "decision.recorded", by="ann", decision="approved"),
        event(11, 451, "status.queued"),  # waited 300 s for ann
        event(12, 453, "lease.claimed", "w3", 3),  # queued 2 s
        event(13, 454, "step", "w3", 3, node="review"),
        event(14, 455, "status.completed", "w3", 3),
    ]
    run = run_row(started_at=110.0, finished_at=455.0, lease_token=3)
    s = summarize(RunDetails(run, timeline, [], [], []), now=1000.0)
    t = s.totals
    assert (t.queued, t.waiting, t.lost) == (12.0, 300.0, 25.0)
    assert t.running == (151 - 110) + (455 - 453) - 25  # leases held, less the lost time
    assert t.total == 455 - 100
    nodes = {n.node: n for n in s.nodes}
    assert (nodes["draft"].queued, nodes["draft"].running) == (10.0, 4.0)
    assert (nodes["send"].lost, nodes["send"].running) == (25.0, 10.0)  # it ran in the crash
    assert (nodes["review"].waiting, nodes["review"].queued, nodes["review"].executions) == (
        300.0,
        2.0,
        2,
    )
    assert [(m.kind, m.at) for m in s.marks] == [
        ("crash", 116),
        ("takeover", 140),
        ("resumed", 453),
    ]
    assert "after draft" in s.marks[0].text and "Boom: in send" in s.marks[0].text
    assert "after send" not in s.marks[1].text and "after draft" in s.marks[1].text
    assert "in review" in s.marks[2].text
    assert [a.why for a in s.attempts] == [
        "first claim",
        "retry 1 of 3 after a crash",
        "resumed after approved by ann",
    ]
    assert [a.first_node for a in s.attempts] == ["draft", "send", "review"]


def test_an_attempt_says_it_followed_a_release_or_a_resume_of_a_failed_run() -> None:
    timeline = [
        event(1, 100, "admitted"),
        event(2, 101, "lease.claimed", "w1", 1),
        event(3, 102, "status.queued", "w1", 1, reason="worker stopping", **{"from": "running"}),
        event(4, 103, "lease.claimed", "w2", 2),
        event(5, 104, "status.failed", "w2", 2),
        event(6, 200, "status.queued", reason="resumed", by="ann", **{"from": "failed"}),
        event(7, 201, "lease.claimed", "w3", 3),
        event(8, 260, "lease.takeover", "w4", 4, previous_owner="w3"),
        event(9, 262, "status.completed", "w4", 4),
    ]
    run = run_row(finished_at=262.0, lease_token=4)
    s = summarize(RunDetails(run, timeline, [], [], []), now=300.0)
    assert [a.why for a in s.attempts] == [
        "first claim",
        "given back by its stopping worker",
        "resumed by ann after it failed",
        "took over from w3: its lease expired (it stopped)",
    ]
    assert s.takeovers == 1 and s.totals.lost == 260 - 201


def test_a_run_holding_off_a_pending_key_says_whose_deadline_it_waits_for() -> None:
    timeline = [
        event(1, 100, "admitted"),
        event(2, 101, "lease.claimed", "w1", 1),
        # w1 was cut off mid-call; w2 took over and holds off until that call's deadline
        event(3, 120, "lease.takeover", "w2", 2),
        event(4, 120.5, "effect.awaiting_deadline", "w2", 2, effect="charge", seconds=6.5),
    ]
    running = run_row(status="running", lease_owner="w2", finished_at=None)
    summary = summarize(RunDetails(running, timeline, [{"status": "pending"}], [], []), 121.0)
    assert summary.outcome == "waiting for effect charge's deadline"
    assert "held by w2" in summary.why and "may still be under way" in summary.why
    timeline.append(event(5, 127, "effect.confirmed", "w2", 2))
    summary = summarize(RunDetails(running, timeline, [{"status": "confirmed"}], [], []), 128.0)
    assert summary.outcome == "running"


def test_a_duration_reads_the_same_in_the_cli_and_the_console() -> None:
    # docs/cli.md shows these: `keel runs show` and the console's pages use the one function.
    texts = [seconds_text(s) for s in (0.0004, 2.1, 31.0, 153.0, 7380.0, 97200.0)]
    assert texts == ["0ms", "2.1s", "31.0s", "2m33s", "2h03m", "1d03h"]
