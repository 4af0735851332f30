"""Deadlines, by hand: each policy applied once (reject, timeout, cancel, fail, escalate then
reject), reminders and escalations sent once each, and a late decision refused. Time is a
ManualClock; the sweeper is the one every worker runs."""

from __future__ import annotations

from collections import Counter

import pytest

import keel
from keel.core import waits
from keel.core.codec import loads
from keel.core.errors import RunFinished
from keel.service.slack import may_decide
from tests.support.by_hand import claim, waiting
from tests.support.notifiers import Recorder
from tests.support.workers import sweep

HOUR = 3600.0


def events(app: keel.App, run_id: str) -> Counter[str]:
    return Counter(e["kind"] for e in app.get_run(run_id).timeline)


@pytest.mark.parametrize(
    ("policy", "decision", "run"),
    [
        ("reject", "rejected", ("queued", "rejected", None)),
        ("timeout", "timed_out", ("queued", "not_decided", None)),
        ("cancel", "cancelled", ("cancelled", "not_decided", "cancelled")),
        ("fail", "timed_out", ("failed", "not_decided", "timed_out")),
    ],
)
def test_each_policy_is_applied_once_at_the_deadline(
    app: keel.App, clock: keel.ManualClock, policy: str, decision: str, run: tuple[str, ...]
) -> None:
    node = waiting(app, timeout="1h", on_timeout=policy)
    clock.advance(HOUR - 1)
    assert sweep(app) == 0, "nothing is due before the deadline"
    clock.advance(2)
    assert sweep(app) == 1
    assert sweep(app) == 0, "applied once"
    details = app.get_run(node.run_id)
    [wait] = details.waits
    assert (wait["status"], wait["decision"], wait["decided_by"]) == (
        "expired",
        decision,
        "keel:deadline",
    )
    assert (details.status, details.decision, details.termination_reason) == run
    assert events(app, node.run_id)["wait.expired"] == 1
    with pytest.raises(RunFinished):
        app.approve(node.run_id, by="too-late", wait_id=wait["wait_id"])
    if details.status == "queued":  # the graph resumes with the policy's decision
        resumed = claim(app, "worker-b")
        resumed.answers.extend(node.resume_values())
        answer = resumed.call(keel.approval, "manager")
        assert (answer.decision, answer.by) == (decision, "keel:deadline")


def test_escalate_extends_the_deadline_once_then_rejects(
    app: keel.App, clock: keel.ManualClock
) -> None:
    app.add_notifier(Recorder("chief"))
    node = waiting(app, timeout="1h", on_timeout="escalate")
    clock.advance(HOUR + 1)
    assert sweep(app) == 1
    assert sweep(app) == 0
    [wait] = app.get_run(node.run_id).waits
    assert (wait["status"], wait["escalation_level"]) == ("pending", 1)
    assert wait["deadline"] > clock.now(), "a person still has time to answer"
    clock.advance(HOUR + 1)
    assert sweep(app) == 1, "the escalated wait reaches its final policy"
    assert sweep(app) == 0
    details = app.get_run(node.run_id)
    assert (details.status, details.decision) == ("queued", "rejected")
    seen = events(app, node.run_id)
    assert (seen["wait.escalated"], seen["wait.expired"]) == (1, 1)
    kinds = Counter(r["kind"] for r in details.notifications)
    assert (kinds["escalate"], kinds["expired"]) == (1, 1)


def test_reminders_and_escalations_are_sent_once_each(
    app: keel.App, clock: keel.ManualClock
) -> None:
    recorder = Recorder("email")
    app.add_notifier(recorder)
    node = waiting(
        app,
        approvers=["ed@example.com"],
        remind_after="1h",
        escalate_after="2h",
        escalate_to=["chief@example.com"],
        timeout="3h",
    )
    for _ in range(2):  # each stage falls due once, however often the sweeper looks
        clock.advance(HOUR)
        assert sweep(app) == 1
        assert sweep(app) == 0
    app.aio.runtime.portal.call(app.aio.runtime.dispatch("worker-a"))
    app.aio.runtime.portal.call(app.aio.runtime.dispatch("worker-b"))
    assert recorder.kinds_sent() == ["request", "remind", "escalate"]
    assert recorder.sent[2].details["to"] == ["chief@example.com"]
    seen = events(app, node.run_id)
    assert (seen["wait.reminded"], seen["wait.escalated"]) == (1, 1)
    [wait] = app.get_run(node.run_id).waits
    assert wait["status"] == "pending", "stages before the deadline decide nothing"


def test_a_wait_decided_in_time_leaves_nothing_to_apply(
    app: keel.App, clock: keel.ManualClock
) -> None:
    node = waiting(app, timeout="1h", on_timeout="cancel")
    assert app.approve(node.run_id, by="alice").recorded
    clock.advance(HOUR + 1)
    assert sweep(app) == 0
    details = app.get_run(node.run_id)
    assert (details.status, details.decision) == ("queued", "approved")
    assert [w["status"] for w in details.waits] == ["decided"]


def test_one_id_given_as_a_string_is_one_approver_not_its_characters(
    app: keel.App, clock: keel.ManualClock
) -> None:
    recorder = Recorder("slack")
    app.add_notifier(recorder)
    node = waiting(
        app, approvers="U0EDITOR", escalate_after="1h", escalate_to="U0CHIEF", timeout="3h"
    )
    [wait] = app.get_run(node.run_id).waits
    assert wait["approvers"] == '["U0EDITOR"]'
    clock.advance(HOUR)
    assert sweep(app) == 1
    app.aio.runtime.portal.call(app.aio.runtime.dispatch("worker-a"))
    request, escalate = recorder.sent
    assert request.wait["approvers"] == ["U0EDITOR"]
    assert escalate.details["to"] == ["U0CHIEF"]


def dispatch(app: keel.App) -> None:
    app.aio.runtime.portal.call(app.aio.runtime.dispatch("worker-a"))


@pytest.mark.parametrize("escalate_after", [None, "30m"])
def test_the_escalate_policy_escalates_to_escalate_to_not_the_approvers(
    app: keel.App, clock: keel.ManualClock, escalate_after: str | None
) -> None:
    recorder = Recorder("slack")
    app.add_notifier(recorder)
    node = waiting(
        app,
        approvers=["U0EDITOR"],
        escalate_to=["U0CHIEF"],
        escalate_after=escalate_after,
        timeout="1h",
        on_timeout="escalate",
    )
    for _ in range(2):  # past escalate_after (if any), then past the deadline
        clock.advance(HOUR / 2 + 1)
        sweep(app)
    dispatch(app)
    escalations = [note for note in recorder.sent if note.kind == "escalate"]
    assert [note.details["to"] for note in escalations] == [["U0CHIEF"]] * len(escalations)
    assert len(escalations) == (2 if escalate_after else 1)
    [wait] = app.get_run(node.run_id).waits
    assert (wait["status"], wait["escalation_level"]) == ("pending", len(escalations))
    escalated = [e for e in app.get_run(node.run_id).timeline if e["kind"] == "wait.escalated"]
    assert [e["data"]["to"] for e in escalated] == [["U0CHIEF"]] * len(escalations)


def test_a_wait_stored_before_escalate_to_was_kept_apart_still_escalates_to_it(
    app: keel.App, clock: keel.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The schedule column as earlier versions wrote it: the list of stages, the escalation
    # targets only inside the `escalate_after` stage.
    monkeypatch.setattr(waits, "stored_schedule", lambda stages, escalate_to: stages)
    recorder = Recorder("slack")
    app.add_notifier(recorder)
    node = waiting(
        app,
        approvers=["U0EDITOR"],
        remind_after="10m",
        escalate_after="30m",
        escalate_to=["U0CHIEF"],
        timeout="1h",
        on_timeout="escalate",
    )
    [wait] = app.get_run(node.run_id).waits
    assert isinstance(loads(wait["schedule"]), list)
    assert may_decide(wait, "U0CHIEF") and not may_decide(wait, "U0OTHER")
    clock.advance(HOUR + 1)
    sweep(app)
    dispatch(app)
    assert recorder.kinds_sent() == ["request", "remind", "escalate", "escalate"]
    assert [note.details["to"] for note in recorder.sent[2:]] == [["U0CHIEF"], ["U0CHIEF"]]
