"""The outbox, by hand: an intent is recorded once per notifier that handles its kind,
delivered once whoever dispatches, and never sent again after its sender died mid-delivery."""

from __future__ import annotations

import asyncio
import sqlite3
from collections import Counter
from typing import Any

import pytest

import keel
from keel.core.errors import TransientError
from keel.runtime.worker import Worker
from tests.support.by_hand import Died, waiting
from tests.support.lost_records import records_fail
from tests.support.notifiers import Recorder


def dispatch(app: keel.App, worker_id: str = "worker-a") -> int:
    return app.aio.runtime.portal.call(app.aio.runtime.dispatch(worker_id))


def intents(app: keel.App, run_id: str) -> list[tuple[str, str, str]]:
    return sorted(
        (r["notifier"], r["kind"], r["status"]) for r in app.get_run(run_id).notifications
    )


def test_an_intent_is_recorded_once_per_notifier_that_handles_its_kind(app: keel.App) -> None:
    for notifier in (Recorder("slack"), Recorder("email"), Recorder("audit", ("decided",))):
        app.add_notifier(notifier)
    node = waiting(app, approvers=["ed@example.com"])
    assert intents(app, node.run_id) == [
        ("email", "request", "queued"),
        ("slack", "request", "queued"),
    ]
    assert app.approve(node.run_id, by="ed").recorded
    assert not app.reject(node.run_id, by="bob").recorded  # a duplicate records nothing
    decided = [(n, s) for n, kind, s in intents(app, node.run_id) if kind == "decided"]
    assert decided == [("audit", "queued"), ("email", "queued"), ("slack", "queued")]


def test_each_intent_is_delivered_once_whoever_dispatches(app: keel.App) -> None:
    slack, email = Recorder("slack"), Recorder("email")
    app.add_notifier(slack)
    app.add_notifier(email)
    node = waiting(app, approvers=["ed@example.com"])
    assert dispatch(app, "worker-a") == 2
    assert dispatch(app, "worker-b") == 0
    assert slack.kinds_sent() == email.kinds_sent() == ["request"]
    assert slack.sent[0].wait["approvers"] == ["ed@example.com"]
    app.approve(node.run_id, by="ed")
    assert dispatch(app, "worker-b") == 2
    assert dispatch(app, "worker-a") == 0
    assert slack.kinds_sent() == email.kinds_sent() == ["request", "decided"]
    decided = slack.sent[-1]
    assert decided.details["decision"] == "approved"
    assert decided.earlier == {"request": {"ts": "request-1"}}, "a decision can edit the request"
    assert {status for _, _, status in intents(app, node.run_id)} == {"delivered"}
    kinds = [e["kind"] for e in app.get_run(node.run_id).timeline]
    assert kinds.count("notification.delivered") == 4


def test_an_intent_whose_sender_died_mid_delivery_is_not_sent_again(
    app: keel.App, clock: keel.ManualClock
) -> None:
    plain = Recorder("plain", failures=[Died()])
    reconciling = Recorder("reconciling", reconcile=True, failures=[Died()])
    app.add_notifier(plain)
    app.add_notifier(reconciling)
    node = waiting(app)
    for _ in range(2):  # each dispatcher delivers one request and dies before settling it
        with pytest.raises(Died):
            dispatch(app)
    assert plain.kinds_sent() == reconciling.kinds_sent() == ["request"]
    assert dispatch(app, "worker-b") == 0, "claimed by a sender that may still be alive"
    clock.advance(app.aio.runtime.lease_ttl + 1)  # the dead senders' claims expire
    assert dispatch(app, "worker-b") == 2
    assert dispatch(app, "worker-b") == 0
    assert plain.kinds_sent() == reconciling.kinds_sent() == ["request"], "sent twice"
    assert intents(app, node.run_id) == [
        ("plain", "request", "in_doubt"),
        ("reconciling", "request", "delivered"),
    ]


def test_a_transient_failure_is_delivered_later_once(
    app: keel.App, clock: keel.ManualClock
) -> None:
    flaky = Recorder("flaky", failures=[TransientError("429", retry_after=60)])
    app.add_notifier(flaky)
    node = waiting(app)
    assert dispatch(app) == 1  # settled for now: queued again, 60 s later
    assert flaky.sent == []
    assert dispatch(app) == 0
    clock.advance(61)
    assert dispatch(app) == 1
    assert dispatch(app) == 0
    assert flaky.kinds_sent() == ["request"]
    assert intents(app, node.run_id) == [("flaky", "request", "delivered")]
    assert (
        Counter(e["kind"] for e in app.get_run(node.run_id).timeline)["notification.delivered"] == 1
    )


def test_a_request_answered_before_it_went_out_is_not_sent(app: keel.App) -> None:
    """Asking a person to act on a wait already decided would have them act on nothing."""
    recorder = Recorder("slack")
    app.add_notifier(recorder)
    node = waiting(app)
    assert app.approve(node.run_id, by="ed").recorded  # before any dispatcher ran
    assert dispatch(app) == 2
    assert recorder.kinds_sent() == ["decided"]
    assert recorder.sent[0].earlier == {}, "no request message to edit: the decision says it all"
    assert intents(app, node.run_id) == [
        ("slack", "decided", "delivered"),
        ("slack", "request", "obsolete"),
    ]
    (row,) = [n for n in app.get_run(node.run_id).notifications if n["kind"] == "request"]
    assert row["error"] == "its wait was decided before it went out"
    kinds = [e["kind"] for e in app.get_run(node.run_id).timeline]
    assert kinds.count("notification.obsolete") == 1


def test_a_request_about_a_run_cancelled_meanwhile_is_not_sent(
    app: keel.App, clock: keel.ManualClock
) -> None:
    """A request held back by a provider's 429 finds, when it is due again, the run cancelled."""
    recorder = Recorder("slack", ("request",), failures=[TransientError("429", retry_after=60)])
    app.add_notifier(recorder)
    node = waiting(app)
    assert dispatch(app) == 1  # queued again, 60 s later
    app.cancel(node.run_id, by="ops")
    clock.advance(61)
    assert dispatch(app) == 1
    assert recorder.sent == []
    assert intents(app, node.run_id) == [("slack", "request", "obsolete")]


def test_a_delivery_whose_record_failed_is_recorded_not_left_in_doubt(app: keel.App) -> None:
    """The database fails the statement recording a sent notification (as a dropped connection
    would): the record is tried again, so the notification is `delivered`, not found `sending`
    by the next dispatcher and marked `in_doubt`."""
    recorder = Recorder("slack")
    app.add_notifier(recorder)
    node = waiting(app)
    left = records_fail(app, "settle_notification", "delivered", 1)
    assert dispatch(app) == 1
    assert left["times"] == 0, "the record never failed"
    assert recorder.kinds_sent() == ["request"]
    assert intents(app, node.run_id) == [("slack", "request", "delivered")]


def test_a_worker_told_to_stop_does_not_wait_out_an_outage_to_record_a_delivery(
    app: keel.App,
) -> None:
    """The record of a sent notification is tried again through an outage, but a worker told
    to stop stops: the notification is then found `sending` and reconciled, as a dead one's."""
    recorder = Recorder("slack")
    app.add_notifier(recorder)
    waiting(app)
    store = app.aio.runtime.services.store

    async def down(tx: Any, intent_id: str, **kw: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")  # the database went away for good

    store.settle_notification = down  # type: ignore[method-assign]

    async def stop_after_the_send() -> bool:
        await app.aio.open()
        worker = Worker(app.aio.runtime, concurrency=1, sweep_interval=0.1)
        running = asyncio.create_task(worker.run())
        for _ in range(200):  # the worker's sweep sends the request
            if recorder.sent:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # its record is being tried again
        worker.stop()
        done, _ = await asyncio.wait([running], timeout=10)
        if not done:  # (the 30 s of trying would outlast this)
            running.cancel()
        return bool(done)

    assert app.aio.runtime.portal.call(stop_after_the_send()), "stop waited out the outage"
    assert recorder.kinds_sent() == ["request"]
