"""Waits, by hand: a pause becomes a wait; the first decision wins and later ones get it back;
a finished run takes no decision; each kind of wait takes only its own kind of answer."""

from __future__ import annotations

from typing import Any

import pytest

import keel
from keel.core.errors import (
    InvalidId,
    NoPendingWait,
    RunFinished,
    RunNotFound,
    UsageError,
    WaitNotFound,
)
from tests.support.by_hand import WORKFLOW, Died, Node, Paused, claim, start, waiting
from tests.support.providers import Provider
from tests.support.workers import sweep


def snapshot(app: keel.App, run_id: str) -> tuple[Any, ...]:
    details = app.get_run(run_id)
    return (details.run, details.timeline, details.waits)


def test_a_pause_is_registered_as_a_wait_with_its_deadline(
    app: keel.App, clock: keel.ManualClock
) -> None:
    node = waiting(app, payload={"to": "c@example.com"}, timeout="1h")
    details = app.get_run(node.run_id)
    assert details.status == "waiting"
    [wait] = details.waits
    assert (wait["kind"], wait["name"], wait["status"]) == ("approval", "manager", "pending")
    assert wait["deadline"] == pytest.approx(clock.now() + 3600)
    assert [e["kind"] for e in details.timeline].count("wait.registered") == 1


def test_the_first_decision_wins_and_later_ones_get_it_back(app: keel.App) -> None:
    node = waiting(app)
    first = app.approve(node.run_id, by="alice", channel="cli", comment="ok")
    later = app.reject(node.run_id, by="bob", channel="slack")
    again = app.approve(node.run_id, by="carol")
    assert (first.recorded, later.recorded, again.recorded) == (True, False, False)
    assert first.decision == later.decision == again.decision == "approved"
    assert later.wait["decided_by"] == again.wait["decided_by"] == "alice"
    details = app.get_run(node.run_id)
    assert (details.status, details.decision) == ("queued", "approved")
    assert [e["kind"] for e in details.timeline].count("decision.recorded") == 1

    # The resumed graph gets the recorded decision: alice's, whoever asked later.
    resumed = claim(app, "worker-b")
    resumed.answers.extend(node.resume_values())
    decision = resumed.call(keel.approval, "manager", payload={"to": "c@example.com"})
    assert (decision.decision, decision.by, decision.channel) == ("approved", "alice", "cli")
    assert decision.approved and decision.comment == "ok"


def test_a_run_waiting_on_several_decisions_needs_the_wait_named(app: keel.App) -> None:
    node = waiting(app, "manager", "legal")
    waits = {w["name"]: w["wait_id"] for w in app.get_run(node.run_id).waits}
    before = snapshot(app, node.run_id)
    with pytest.raises(UsageError, match="name one"):
        app.approve(node.run_id, by="alice")
    assert snapshot(app, node.run_id) == before
    assert app.approve(node.run_id, by="alice", wait_id=waits["legal"]).recorded
    decided = {w["name"]: w["status"] for w in app.get_run(node.run_id).waits}
    assert decided == {"manager": "pending", "legal": "decided"}


def test_a_finished_run_takes_no_decision_and_nothing_changes(app: keel.App) -> None:
    node = waiting(app)
    assert app.cancel(node.run_id, by="ops")["status"] == "cancelled"
    before = snapshot(app, node.run_id)
    for decide in (app.approve, app.reject):
        with pytest.raises(RunFinished):
            decide(node.run_id, by="late")
    assert snapshot(app, node.run_id) == before
    assert [w["status"] for w in app.get_run(node.run_id).waits] == ["expired"]


def test_a_decided_wait_tells_who_decided_it_after_the_run_finished(app: keel.App) -> None:
    node = waiting(app)
    [wait] = app.get_run(node.run_id).waits
    assert app.approve(node.run_id, by="alice", wait_id=wait["wait_id"]).recorded
    assert app.cancel(node.run_id, by="ops")["status"] == "cancelled"  # finished, decided
    before = snapshot(app, node.run_id)
    for decide in (app.approve, app.reject):
        late = decide(node.run_id, by="bob", wait_id=wait["wait_id"], action_id="click-2")
        assert (late.recorded, late.finished, late.decision) == (False, True, "approved")
        assert late.wait["decided_by"] == "alice"
    assert snapshot(app, node.run_id) == before


def test_a_pending_wait_of_a_run_that_ended_otherwise_is_refused(
    app: keel.App, clock: keel.ManualClock
) -> None:
    # Two waits at once; the first one's deadline policy fails the run, the second is left
    # pending on a finished run: nobody decides it any more.
    node = start(app)
    node.ask("legal", timeout="1h", on_timeout="fail")
    node.ask("manager", timeout="2h")
    assert node.register_pauses() == "waiting"
    clock.advance(3600 + 1)
    assert sweep(app) == 1
    details = app.get_run(node.run_id)
    assert details.status == "failed"
    pending = {w["name"]: w for w in details.waits}["manager"]
    assert pending["status"] == "pending"
    before = snapshot(app, node.run_id)
    with pytest.raises(RunFinished, match="failed"):
        app.approve(node.run_id, by="bob", wait_id=pending["wait_id"])
    assert snapshot(app, node.run_id) == before


def test_decisions_name_a_run_and_a_wait_that_exist(app: keel.App) -> None:
    node = waiting(app)
    with pytest.raises(RunNotFound):
        app.approve("no-such-run-0123456789abcdef", by="alice")
    with pytest.raises(InvalidId):
        app.approve("../../etc/passwd", by="alice")
    with pytest.raises(WaitNotFound):
        app.approve(node.run_id, by="alice", wait_id="w-nope")
    queued = app.submit(WORKFLOW, job_id="job-2", input={"job": "job-2"})["run_id"]
    with pytest.raises(NoPendingWait):
        app.approve(queued, by="alice")


def in_doubt(app: keel.App) -> tuple[Node, Provider]:
    """A run waiting for a person to say whether its email reached the provider."""
    provider = Provider()
    crashed: list[bool] = []

    @keel.effect("send")
    def send(to: str, *, idempotency_key: str) -> Any:
        provider.deliver(idempotency_key, to)
        if not crashed:
            crashed.append(True)
            raise Died  # the worker died after the provider accepted it
        return {"id": "sent"}

    node = start(app)
    with pytest.raises(Died):
        node.call(send, "a@example.com")
    with pytest.raises(Paused):
        node.call(send, "a@example.com")  # the replay finds the key pending: in doubt
    assert node.register_pauses() == "waiting"
    return node, provider


def test_an_in_doubt_effect_takes_only_performed_or_not_performed(app: keel.App) -> None:
    node, provider = in_doubt(app)
    before = snapshot(app, node.run_id)
    for answer in (app.approve, app.reject):
        with pytest.raises(UsageError, match=r"resolve_effect\(\)"):
            answer(node.run_id, by="alice")
    assert snapshot(app, node.run_id) == before
    resolved = app.resolve_effect(node.run_id, performed=True, by="support")
    assert resolved.recorded and resolved.decision == "performed"
    details = app.get_run(node.run_id)
    assert details.decision == "not_decided"  # settling an effect is not an approval
    assert len(provider.deliveries) == 1


def test_an_approval_takes_no_effect_answer(app: keel.App) -> None:
    node = waiting(app)
    before = snapshot(app, node.run_id)
    for performed in (True, False):
        with pytest.raises(UsageError, match=r"approve\(\) or reject\(\)"):
            app.resolve_effect(node.run_id, performed=performed)
    assert snapshot(app, node.run_id) == before
