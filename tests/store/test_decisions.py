"""Decisions: the first one wins, atomically, whoever and however many race for it."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import pytest

import keel
from keel.core.decisions import DecisionResult
from keel.core.errors import InvalidId, NoPendingWait, RunFinished, RunNotFound, WaitNotFound
from tests.support import deciders
from tests.support.graphs import echo_graph, notify_effect, review_graph
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def waiting_review(make_app: AppFactory, provider: Provider | None = None) -> tuple[keel.App, str]:
    """An app with a run waiting for a manager's approval."""
    app = make_app()
    notify = notify_effect(provider or Provider())
    app.workflow("review")(lambda: review_graph(notify))
    run = app.submit("review", job_id="ticket-1", input={"to": "c@example.com", "log": []})
    drain(app)
    assert app.get_run(run["run_id"]).status == "waiting"
    return app, run["run_id"]


def decisions_recorded(app: keel.App, run: str) -> int:
    return sum(e["kind"] == "decision.recorded" for e in app.get_run(run).timeline)


def test_first_decision_wins_and_later_ones_get_it_back(make_app: AppFactory) -> None:
    provider = Provider()
    app, run = waiting_review(make_app, provider)
    first = app.approve(run, by="alice", comment="ok", channel="cli")
    later = app.reject(run, by="bob", channel="slack")
    assert (first.recorded, later.recorded) == (True, False)
    assert first.decision == later.decision == "approved"
    assert later.wait["decided_by"] == "alice" and later.wait["channel"] == "cli"
    assert decisions_recorded(app, run) == 1
    drain(app)
    details = app.get_run(run)
    assert (details.status, details.decision, details.termination_reason) == (
        "completed",
        "approved",
        "approved",
    )
    assert details.output["log"] == ["approved", "sent"]
    assert len(provider.deliveries) == 1


def test_rejected_run_ends_rejected_and_performs_nothing(make_app: AppFactory) -> None:
    provider = Provider()
    app, run = waiting_review(make_app, provider)
    assert app.reject(run, by="carol", comment="wrong tone").recorded
    drain(app)
    details = app.get_run(run)
    assert (details.status, details.decision, details.termination_reason) == (
        "completed",
        "rejected",
        "rejected",
    )
    assert details.output["log"] == ["rejected"]
    assert provider.calls == [] and details.effects == []
    [wait] = details.waits
    assert (wait["status"], wait["decision"], wait["comment"]) == (
        "decided",
        "rejected",
        "wrong tone",
    )


def test_twenty_racing_deciders_record_exactly_one_decision(make_app: AppFactory) -> None:
    app, run = waiting_review(make_app)
    apps = [app, *(make_app() for _ in range(3))]  # four connections racing, not one
    start = threading.Barrier(20)
    results: list[tuple[str, DecisionResult]] = []
    errors: list[BaseException] = []

    def decide(i: int) -> None:
        who = apps[i % len(apps)]
        by = f"user-{i}"
        try:
            start.wait(timeout=30)
            result = (who.approve if i % 2 else who.reject)(run, by=by, action_id=f"a-{i}")
            results.append((by, result))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(results) == 20
    winners = [by for by, r in results if r.recorded]
    assert len(winners) == 1
    assert {r.decision for _, r in results} == {results[0][1].decision}
    assert {r.wait["decided_by"] for _, r in results} == {winners[0]}
    assert decisions_recorded(app, run) == 1
    details = app.get_run(run)
    assert details.decision == results[0][1].decision
    assert details.waits[0]["decided_by"] == winners[0]
    assert details.status == "queued"


def test_four_processes_racing_record_exactly_one_decision(
    make_app: AppFactory, db_url: str
) -> None:
    app, run = waiting_review(make_app)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(4)
    out: Any = ctx.Queue()
    procs = [
        ctx.Process(target=deciders.decide, args=(db_url, run, i % 2 == 0, f"proc-{i}", start, out))
        for i in range(4)
    ]
    for p in procs:
        p.start()
    try:
        reports = [out.get(timeout=60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert [r for r in reports if r[1] == "error"] == []
    winners = [by for by, recorded, _, _ in reports if recorded]
    assert len(winners) == 1
    assert {decision for _, _, decision, _ in reports} == {app.get_run(run).decision}
    assert {decided_by for _, _, _, decided_by in reports} == set(winners)
    assert decisions_recorded(app, run) == 1


def test_decision_on_unknown_run_raises_run_not_found(make_app: AppFactory) -> None:
    app, run = waiting_review(make_app)
    with pytest.raises(RunNotFound, match="no-such-run"):
        app.approve("no-such-run", by="alice")
    assert decisions_recorded(app, run) == 0


@pytest.mark.parametrize("bad", ["", "../../etc/passwd", "Run 1", "x" * 200])
def test_decision_on_malformed_run_id_raises_invalid_id(make_app: AppFactory, bad: str) -> None:
    app = make_app()
    with pytest.raises(InvalidId, match="run_id"):
        app.approve(bad, by="alice")


def test_decision_on_completed_run_raises_run_finished_and_changes_nothing(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="e-1", input={"text": "x"})["run_id"]
    drain(app)
    before = app.get_run(run)
    assert before.status == "completed"
    with pytest.raises(RunFinished, match="completed"):
        app.approve(run, by="alice")
    with pytest.raises(RunFinished):
        app.resolve_effect(run, performed=True)
    after = app.get_run(run)
    assert after.run == before.run
    assert after.timeline == before.timeline


def test_late_decision_after_the_run_finished_changes_nothing(make_app: AppFactory) -> None:
    app, run = waiting_review(make_app)
    app.reject(run, by="alice")
    drain(app)
    before = app.get_run(run)
    with pytest.raises(RunFinished):
        app.approve(run, by="bob")
    after = app.get_run(run)
    assert (after.run, after.timeline, after.waits) == (before.run, before.timeline, before.waits)
    assert after.decision == "rejected"


def test_late_decision_naming_the_decided_wait_of_a_finished_run_is_told_who_decided(
    make_app: AppFactory,
) -> None:
    # Slack, the console and the HTTP API name the wait: a late click, a second approver, is
    # told what was recorded, whether or not a worker finished the run meanwhile.
    app, run = waiting_review(make_app)
    wait_id = app.approve(run, by="alice", action_id="click-1").wait["wait_id"]
    drain(app)
    before = app.get_run(run)
    for late in (app.reject, app.approve):
        answer = late(run, wait_id=wait_id, by="bob", action_id="click-2")
        assert (answer.recorded, answer.finished, answer.decision) == (False, True, "approved")
        assert answer.wait["decided_by"] == "alice"
    # The winning call itself, retried (same action id), is told what it recorded too.
    retry = app.approve(run, wait_id=wait_id, by="alice", action_id="click-1")
    assert (retry.recorded, retry.decision) == (False, "approved")
    # Naming the run only, there is no wait to answer: the run is finished.
    with pytest.raises(RunFinished, match="completed"):
        app.reject(run, by="bob")
    after = app.get_run(run)
    assert (after.run, after.timeline, after.waits) == (before.run, before.timeline, before.waits)


def test_a_decision_keeps_the_principal_beside_the_by(make_app: AppFactory) -> None:
    app, run = waiting_review(make_app)
    app.approve(run, by="alice", principal="token:3f9a")
    details = app.get_run(run)
    (recorded,) = [e for e in details.timeline if e["kind"] == "decision.recorded"]
    assert (recorded["data"]["by"], recorded["data"]["principal"]) == ("alice", "token:3f9a")
    assert details.waits[0]["decided_by"] == "alice"
    value = json.loads(details.waits[0]["value"])
    assert keel.ApprovalDecision.from_value(value).principal == "token:3f9a"


def test_decision_on_queued_run_without_wait_raises_no_pending_wait(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="e-1", input={"text": "x"})["run_id"]
    before = app.get_run(run)
    with pytest.raises(NoPendingWait, match="queued"):
        app.approve(run, by="alice")
    after = app.get_run(run)
    assert (after.run, after.timeline) == (before.run, before.timeline)


def test_decision_naming_an_unknown_wait_raises_wait_not_found(make_app: AppFactory) -> None:
    app, run = waiting_review(make_app)
    with pytest.raises(WaitNotFound, match="w-nope"):
        app.approve(run, by="alice", wait_id="w-nope")
    assert app.get_run(run).waits[0]["status"] == "pending"
