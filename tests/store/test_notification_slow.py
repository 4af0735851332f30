"""A provider slower than a notification's claim, to a real SMTP server on 127.0.0.1.

The server accepts the message (counted: the person has it) and holds its "250" three lease
TTLs. The sender renews its claim meanwhile (keel/core/notification_outbox.py), so another
dispatcher polling all along does not take it for a dead sender: the email is received once and
recorded `delivered`, not `in_doubt` for a person to resolve. A claim is fenced by its holder
and its number, so the same worker's later claim is not the earlier one's. A send that never
ends is bounded by its notifier's send timeout; an email accepted before QUIT went wrong is
delivered. A reconcile that never ends is bounded the same way, and never leads to a send; an
async one asked again and again ends `in_doubt` after a bounded number of looks.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import keel
from keel.core import notification_outbox
from keel.notifiers.email import EmailNotifier
from keel.testing import SmtpSink
from tests.support.by_hand import WORKFLOW, one_node, waiting
from tests.support.checks import wait_until

TTL = 1.0
"""The apps' lease TTL, and so a notification's claim: the server holds its reply three times it."""


def _on_loop(app: keel.App, fn: Callable[[], Any]) -> Any:
    async def go() -> Any:
        await app.aio.open()
        return await fn()

    return app.aio.runtime.portal.call(go())


def statuses(app: keel.App, run_id: str) -> list[tuple[str, str]]:
    return [(n["kind"], n["status"]) for n in app.get_run(run_id).notifications]


def _sender_and_rival(
    make_app: Callable[..., keel.App], sink: SmtpSink
) -> tuple[keel.App, keel.App, Any]:
    """Two apps emailing through `sink`, and a run of the sender's waiting with its request
    notification due."""
    sender, rival = make_app(lease_ttl=TTL), make_app(lease_ttl=TTL)
    sender.workflow(WORKFLOW)(one_node)
    for app in (sender, rival):
        app.add_notifier(EmailNotifier(sink.url, "keel@example.com"))
    return sender, rival, waiting(sender, approvers=["ed@example.com"])


def _send_while_a_rival_polls(sender: keel.App, rival: keel.App, sink: SmtpSink) -> tuple[int, int]:
    """The sender dispatches (in a thread) while the rival dispatches again and again until the
    sender is done: (notifications the sender settled, those the rival settled)."""
    sent: list[int] = []
    sending = threading.Thread(
        target=lambda: sent.append(_on_loop(sender, lambda: sender.aio.runtime.dispatch("sender")))
    )
    sending.start()
    polled = 0
    try:
        wait_until(lambda: sink.messages, 10, "the request at the server")
        while sending.is_alive():
            polled += _on_loop(rival, lambda: rival.aio.runtime.dispatch("rival"))
            time.sleep(TTL / 5)
    finally:
        sending.join()
    return sum(sent), polled


def test_an_email_slower_than_its_claim_is_received_once_and_recorded_delivered(
    make_app: Callable[..., keel.App],
) -> None:
    with SmtpSink() as sink:
        sender, rival, node = _sender_and_rival(make_app, sink)
        sink.hold = 3 * TTL
        sent, polled = _send_while_a_rival_polls(sender, rival, sink)
        assert sent == 1
        assert polled == 0, "the rival took the live sender's notification for a dead one's"
        assert sink.count(x_keel_notification="request") == 1
        assert statuses(sender, node.run_id) == [("request", "delivered")]
        kinds = [e["kind"] for e in sender.get_run(node.run_id).timeline]
        assert kinds.count("notification.delivered") == 1
        assert "notification.in_doubt" not in kinds


def test_a_renewal_after_the_database_was_away_keeps_a_claim_nobody_took(
    make_app: Callable[..., keel.App], backend: str
) -> None:
    """The sender's renewals fail twice (its database away for two thirds of the TTL), so its
    next one lands after the claim's expiry. Nobody took the claim meanwhile: it is still this
    claim's, and renewing it goes on; it used to be refused as lapsed, renewal stopped for the
    rest of the send, and the rival sent the email a second time."""
    with SmtpSink() as sink:
        sender, rival, node = _sender_and_rival(make_app, sink)
        store = sender.aio.runtime.store
        renew, failed = store.renew_notification_claim, [0]

        async def away_twice(*args: Any, **kwargs: Any) -> bool:
            if failed[0] < 2:
                failed[0] += 1
                raise _unreachable(backend)
            return await renew(*args, **kwargs)

        store.renew_notification_claim = away_twice  # type: ignore[method-assign]
        sink.hold = 4 * TTL
        _send_while_a_rival_polls(sender, rival, sink)
        assert failed[0] == 2
        assert sink.count(x_keel_notification="request") == 1
        assert statuses(sender, node.run_id) == [("request", "delivered")]


def _unreachable(backend: str) -> Exception:
    """What the backend's driver raises while its database is away."""
    if backend == "postgres":
        import psycopg

        return psycopg.OperationalError("server closed the connection unexpectedly")
    import sqlite3

    return sqlite3.OperationalError("database is locked")


def test_a_claim_taken_again_by_the_same_worker_fences_out_the_earlier_one(
    make_app: Callable[..., keel.App],
) -> None:
    """A worker's earlier claim, lapsed and taken again by its own later pass, neither renews
    nor settles: the later claim's outcome stands."""
    app = make_app(lease_ttl=TTL)
    app.workflow(WORKFLOW)(one_node)
    app.add_notifier(EmailNotifier("smtp://127.0.0.1:9", "keel@example.com"))
    node = waiting(app, approvers=["ed@example.com"])
    store = app.aio.runtime.store

    def claim() -> Any:
        return _on_loop(app, lambda: notification_outbox._claim(store, "w", 0.2))

    earlier, _ = claim()
    time.sleep(0.4)  # the earlier claim lapses (by the database's clock)
    later, in_doubt = claim()
    assert in_doubt and later["attempts"] == earlier["attempts"] + 1

    async def renew(row: Any) -> bool:
        return await store.renew_notification_claim(
            row["intent_id"], worker_id="w", attempts=row["attempts"], ttl=TTL
        )

    async def settle(row: Any, status: str) -> Any:
        async with store.transaction() as tx:
            return await store.settle_notification(
                tx,
                row["intent_id"],
                worker_id="w",
                attempts=row["attempts"],
                status=status,
                result="null",
                error=None,
                delay=0.0,
            )

    assert not _on_loop(app, lambda: renew(earlier))
    assert _on_loop(app, lambda: renew(later))
    # The earlier claim's sender settles while the later one still holds it: nothing written.
    assert _on_loop(app, lambda: settle(earlier, "delivered")) is None
    assert _on_loop(app, lambda: settle(later, "in_doubt")) is not None
    assert statuses(app, node.run_id) == [("request", "in_doubt")]


def test_an_email_the_server_never_answers_ends_in_doubt_at_its_send_timeout(
    make_app: Callable[..., keel.App],
) -> None:
    """A send is bounded: past its notifier's send timeout (and as long again for its thread)
    the server accepted it but never said so, and nobody may send it again: in doubt."""
    with SmtpSink() as sink:
        app = make_app(lease_ttl=TTL)
        app.workflow(WORKFLOW)(one_node)
        app.add_notifier(
            EmailNotifier(sink.url, "keel@example.com", timeout=10 * TTL, send_timeout=TTL)
        )
        node = waiting(app, approvers=["ed@example.com"])
        sink.hold = 6 * TTL  # longer than the send is waited for, shorter than smtplib waits
        started = time.monotonic()
        assert _on_loop(app, lambda: app.aio.runtime.dispatch("sender")) == 1
        assert time.monotonic() - started < 4 * TTL
        assert statuses(app, node.run_id) == [("request", "in_doubt")]
        (row,) = app.get_run(node.run_id).notifications
        assert row["error"] == "its send outlived its timeout"
        time.sleep(TTL)
        assert _on_loop(app, lambda: app.aio.runtime.dispatch("other")) == 0
        assert sink.count(x_keel_notification="request") == 1


class Hanging:
    """An async notifier whose provider never answers."""

    name = "hanging"
    kinds = ("request",)
    send_timeout = TTL

    def __init__(self) -> None:
        self.calls = 0

    async def send(self, note: Any) -> Any:
        self.calls += 1
        await asyncio.sleep(3600)


def test_an_async_send_that_never_answers_is_cancelled_and_left_for_reconciliation(
    make_app: Callable[..., keel.App],
) -> None:
    app = make_app(lease_ttl=TTL)
    app.workflow(WORKFLOW)(one_node)
    notifier = Hanging()
    app.add_notifier(notifier)
    node = waiting(app)
    started = time.monotonic()
    assert _on_loop(app, lambda: app.aio.runtime.dispatch("sender")) == 1
    assert time.monotonic() - started < 3 * TTL
    assert statuses(app, node.run_id) == [("request", "sending")]  # its claim not renewed
    time.sleep(TTL * 1.2)
    assert _on_loop(app, lambda: app.aio.runtime.dispatch("other")) == 1
    assert statuses(app, node.run_id) == [("request", "in_doubt")]  # no reconcile: a person
    assert notifier.calls == 1


@pytest.mark.parametrize(
    "goodbye", [(3 * TTL, "221 Bye"), (0.0, "421 Service closing")], ids=["unanswered", "421"]
)
def test_an_email_accepted_before_quit_went_wrong_is_recorded_delivered(
    make_app: Callable[..., keel.App], goodbye: tuple[float, str]
) -> None:
    """The server said 250 to DATA (the person has the email), then never answered QUIT or
    answered it with an error: the message was delivered, and is recorded so, never `failed`
    (nor retried: a 4xx there would read as "not now, try again")."""
    with SmtpSink() as sink:
        app = make_app(lease_ttl=TTL)
        app.workflow(WORKFLOW)(one_node)
        app.add_notifier(EmailNotifier(sink.url, "keel@example.com", timeout=TTL / 2))
        node = waiting(app, approvers=["ed@example.com"])
        sink.hold_quit, sink.quit_reply = goodbye
        assert _on_loop(app, lambda: app.aio.runtime.dispatch("sender")) == 1
        assert sink.count(x_keel_notification="request") == 1
        assert statuses(app, node.run_id) == [("request", "delivered")]
        (row,) = app.get_run(node.run_id).notifications
        assert json.loads(row["result"])["message_id"] == sink.messages[0].message_id


class SlowToReconcile:
    """A notifier whose first `reconcile` hangs (ten TTLs: far past its bound), whose later ones
    find the message; `send` is counted, and never expected."""

    name = "slow-reconcile"
    kinds = ("request",)
    send_timeout = TTL

    def __init__(self) -> None:
        self.sends = 0
        self.reconciles = 0
        self.released = threading.Event()

    def send(self, note: Any) -> Any:
        self.sends += 1
        return {"sent": True}

    def found(self) -> Any:
        self.reconciles += 1
        return {"found": True} if self.reconciles > 1 else None


class AsyncSlowToReconcile(SlowToReconcile):
    async def reconcile(self, note: Any) -> Any:
        if self.reconciles == 0:
            self.reconciles += 1
            await asyncio.sleep(10 * TTL)
            return None
        return self.found()


class SyncSlowToReconcile(SlowToReconcile):
    def reconcile(self, note: Any) -> Any:
        if self.reconciles == 0:
            self.reconciles += 1
            self.released.wait(10 * TTL)
            return None
        return self.found()


def _claimed_by_a_dead_sender(
    make_app: Callable[..., keel.App], notifier: Any, *, sent: bool = False
) -> Any:
    """An app whose one notification is `sending` under a lapsed claim (its sender died after
    sending it, if `sent`), and its run."""
    app = make_app(lease_ttl=TTL)
    app.workflow(WORKFLOW)(one_node)
    app.add_notifier(notifier)
    node = waiting(app, approvers=["ed@example.com"])
    store = app.aio.runtime.store
    row, _ = _on_loop(app, lambda: notification_outbox._claim(store, "dead", 0.2))
    if sent:
        notifier.send(notification_outbox._notification(row, []))
    time.sleep(0.4)  # its claim lapses (by the database's clock)
    return app, node.run_id


def test_an_async_reconcile_that_hangs_is_cancelled_and_asked_again_later(
    make_app: Callable[..., keel.App],
) -> None:
    """A reconcile is bounded as a send is: the dispatcher is back within about the bound, the
    notification left `sending` for a later pass, which asks again (and finds it): never sent."""
    notifier = AsyncSlowToReconcile()
    app, run_id = _claimed_by_a_dead_sender(make_app, notifier)
    started = time.monotonic()
    assert _on_loop(app, lambda: app.aio.runtime.dispatch("reconciler")) == 1
    assert time.monotonic() - started < 3 * TTL
    assert statuses(app, run_id) == [("request", "sending")]  # its claim left to lapse
    assert _on_loop(app, lambda: app.aio.runtime.dispatch("other")) == 0  # not yet lapsed
    time.sleep(TTL * 1.2)
    assert _on_loop(app, lambda: app.aio.runtime.dispatch("other")) == 1
    assert statuses(app, run_id) == [("request", "delivered")]
    (row,) = app.get_run(run_id).notifications
    assert json.loads(row["result"]) == {"found": True}
    assert (notifier.reconciles, notifier.sends) == (2, 0)


def test_a_sync_reconcile_that_hangs_ends_in_doubt(make_app: Callable[..., keel.App]) -> None:
    """A sync reconcile cannot be stopped: past its bound and as long again, with its thread
    still running, the notification is `in_doubt` (asked again at every pass, such threads
    would pile up), and nothing is sent."""
    notifier = SyncSlowToReconcile()
    app, run_id = _claimed_by_a_dead_sender(make_app, notifier)
    try:
        started = time.monotonic()
        assert _on_loop(app, lambda: app.aio.runtime.dispatch("reconciler")) == 1
        assert time.monotonic() - started < 4 * TTL
        assert statuses(app, run_id) == [("request", "in_doubt")]
        (row,) = app.get_run(run_id).notifications
        assert row["error"] == "its reconcile outlived its timeout"
    finally:
        notifier.released.set()
    time.sleep(TTL * 1.2)
    assert _on_loop(app, lambda: app.aio.runtime.dispatch("other")) == 0
    assert (notifier.reconciles, notifier.sends) == (1, 0)


class LookupNeverAnswers:
    """Emails through a real SMTP server; its look for a message (an async reconcile) never
    answers. Sends and looks are counted."""

    name = "email"
    kinds = ("request",)
    send_timeout = TTL / 2

    def __init__(self, smtp_url: str) -> None:
        self.email = EmailNotifier(smtp_url, "keel@example.com")
        self.sends = 0
        self.reconciles = 0

    def send(self, note: Any) -> Any:
        self.sends += 1
        return self.email.send(note)

    async def reconcile(self, note: Any) -> Any:
        self.reconciles += 1
        await asyncio.sleep(3600)


def test_an_async_reconcile_that_never_answers_ends_in_doubt_after_its_bound(
    make_app: Callable[..., keel.App],
) -> None:
    """A sender died after the server took its email. The look for it never answers: each is
    cancelled at the send timeout and asked again once its claim lapsed, until
    RECONCILE_TIMEOUTS went unanswered; then the notification is `in_doubt` for a person, as
    with a sync look still under way. It used to be asked at every pass, for ever. The person
    has the email once: it is never sent again."""
    with SmtpSink() as sink:
        notifier = LookupNeverAnswers(sink.url)
        app, run_id = _claimed_by_a_dead_sender(make_app, notifier, sent=True)
        assert sink.count(x_keel_notification="request") == 1
        bound = notification_outbox.RECONCILE_TIMEOUTS

        def in_doubt() -> bool:
            _on_loop(app, lambda: app.aio.runtime.dispatch("reconciler"))
            return statuses(app, run_id) == [("request", "in_doubt")]

        # Each look takes its send timeout, then its claim lapses within a TTL: ample room.
        wait_until(in_doubt, 8 * bound * TTL, lambda: f"in doubt ({notifier.reconciles} looks)")
        (row,) = app.get_run(run_id).notifications
        assert row["error"] == f"its reconcile went unanswered {bound} times"
        assert notifier.reconciles == bound
        time.sleep(TTL * 1.2)
        assert _on_loop(app, lambda: app.aio.runtime.dispatch("other")) == 0
        assert (notifier.reconciles, notifier.sends) == (bound, 1)
        assert sink.count(x_keel_notification="request") == 1
        kinds = [e["kind"] for e in app.get_run(run_id).timeline]
        assert kinds.count("notification.in_doubt") == 1
