"""The notification outbox: notifications about waits, recorded now, delivered later, each at
most once. (User effects have an outbox of their own, of intents: keel.core.effects.outbox.)

A notification is inserted in the same transaction as the change it announces (a wait
registered, a reminder or escalation due, a decision recorded, a deadline applied), so it
exists if and only if the change committed. Every worker runs a dispatcher that claims due
notifications and hands them to the App's notifiers (Slack, email, ...), with the
notification's id as idempotency key. Its rows are table `keel_outbox`.

Delivery follows the ledger's rule: a notification found `sending` under an expired claim may
or may not have been delivered by a sender that died. Keel asks the notifier's `reconcile` if
it has one, and otherwise marks it `in_doubt` rather than sending it twice. So that a slow
provider is not taken for a dead sender, the claim is renewed while the notifier sends or
reconciles, for at most `SEND_TIMEOUT` seconds (or the notifier's own `send_timeout`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any

from keel.core.codec import dumps, loads
from keel.core.effects.calls import STILL_RUNNING, TIMED_OUT, call_by_deadline
from keel.core.errors import TransientError
from keel.core.ids import digest
from keel.core.infra import outlast
from keel.core.leases import claim_kept
from keel.core.lifecycle import Status
from keel.core.notifications import Notification, Notifier, notification_payload
from keel.core.services import Services
from keel.core.store.base import Row, Tx
from keel.core.store.store import Store
from keel.core.wait_model import WaitStatus

log = logging.getLogger("keel.core.notification_outbox")


class NotificationStatus(StrEnum):
    """Where a notification is: queued -> sending -> delivered, or failed, in_doubt, obsolete."""

    QUEUED = "queued"
    SENDING = "sending"
    DELIVERED = "delivered"
    FAILED = "failed"
    IN_DOUBT = "in_doubt"
    """Its sender died mid-delivery and the notifier cannot say whether it went out."""
    OBSOLETE = "obsolete"
    """It asked a person to act, and before it went out its wait was answered or its run ended
    (cancelled, or a paused run ended by new input on its thread): never sent."""


SEND_TIMEOUT = 60.0
"""Seconds a notifier's `send` (or `reconcile`) may take, unless it declares its own
`send_timeout`. Its claim is renewed meanwhile. Past it an async call is cancelled and its claim
left to lapse: the next dispatcher reconciles it as a dead sender's (asks again, for a
reconcile, up to RECONCILE_TIMEOUTS times). A sync call cannot be stopped: it is waited for as
long again, and if its thread still runs then the notification is `in_doubt`."""
RECONCILE_TIMEOUTS = 3
"""Async reconciles of one notification that may go unanswered within its send timeout (each
cancelled, then asked again once its claim lapsed) before it is `in_doubt`, never sent: a
provider that never answers the look is not asked at every pass for ever."""
RECORD_OUTLAST = 30.0
"""Seconds a notification's outcome is recorded again through an outage (keel.core.infra)."""
ASKS = frozenset({"request", "remind", "escalate"})
"""The kinds that ask a person to act on a wait, rather than tell what became of it."""
OVER = frozenset({Status.COMPLETED, Status.CANCELLED})
"""Run statuses nothing answers a wait in any more (a failed run may be resumed, waits and all)."""


def notification_id(run_id: str, wait_id: str, kind: str, stage: int, notifier: str) -> str:
    """A notification's id: the same on every replay of the change it announces."""
    return "n:" + digest(run_id, wait_id, kind, str(stage), notifier)[:32]


async def record(
    services: Services,
    tx: Tx,
    run: Row,
    wait: Row,
    kind: str,
    *,
    stage: int = 0,
    details: dict[str, Any] | None = None,
) -> None:
    """Insert one notification per notifier that handles `kind` (once: a replay inserts none)."""
    payload = notification_payload(
        run["job_id"],
        run["workflow"],
        wait["wait_id"],
        wait["kind"],
        wait["name"],
        wait["payload"],
        wait["approvers"],
        wait["deadline"],
        dumps({"stage": stage, **(details or {})}),
    )
    for notifier in services.notifiers.values():
        if kind not in notifier.kinds:
            continue
        await services.store.insert_notification(
            tx,
            {
                "intent_id": notification_id(
                    run["run_id"], wait["wait_id"], kind, stage, notifier.name
                ),
                "run_id": run["run_id"],
                "wait_id": wait["wait_id"],
                "notifier": notifier.name,
                "kind": kind,
                "payload": payload,
            },
        )


async def dispatch(
    services: Services, worker_id: str, limit: int = 20, stopping: asyncio.Event | None = None
) -> int:
    """Deliver up to `limit` due notifications; return how many were settled. Once `stopping`
    is set, an outcome's record stops waiting out an outage."""
    settled = 0
    for _ in range(limit):
        claimed = await _claim(services.store, worker_id, services.lease_ttl)
        if claimed is None:
            break
        await _deliver(services, worker_id, *claimed, stopping=stopping)
        settled += 1
    return settled


async def _claim(store: Store, worker_id: str, ttl: float) -> tuple[Row, bool] | None:
    async with store.transaction() as tx:
        candidate = await store.notification_candidate(tx)
        if candidate is None:
            return None
        in_doubt = candidate["status"] == NotificationStatus.SENDING
        row = await store.claim_notification(
            tx,
            candidate["intent_id"],
            status=NotificationStatus.SENDING,
            worker_id=worker_id,
            ttl=ttl,
        )
    assert row is not None
    return row, in_doubt


async def _deliver(
    services: Services,
    worker_id: str,
    row: Row,
    in_doubt: bool,
    *,
    stopping: asyncio.Event | None = None,
) -> None:
    settle = functools.partial(_settle, services, worker_id, row, stopping=stopping)
    notifier = services.notifiers.get(row["notifier"])
    if notifier is None:
        await settle(NotificationStatus.FAILED, error="no such notifier registered")
        return
    related = await services.store.notifications_for_wait(row["wait_id"])
    if not in_doubt and _request_in_flight(row, related):
        # Its request is on its way out (another dispatcher's): what follows it (a
        # decision edits the request's message) waits, or it would miss it and leave the
        # request's buttons live.
        await services.store.defer_notification(
            row["intent_id"], worker_id=worker_id, attempts=row["attempts"], delay=AFTER_REQUEST
        )
        return
    note = _notification(row, related)
    if in_doubt:
        reconcile = getattr(notifier, "reconcile", None)
        if reconcile is None:
            log.warning(
                "notification %s may have been sent by a dead worker: in doubt", row["intent_id"]
            )
            await settle(NotificationStatus.IN_DOUBT)
            return
        try:
            found = await _bounded(services, worker_id, row, notifier, reconcile, note)
        except Exception:
            # Can't tell yet: keep the claim until it expires, then ask again; never resend.
            log.warning("reconciling notification %s failed", row["intent_id"], exc_info=True)
            return
        if found is TIMED_OUT:
            await _reconcile_timed_out(services, worker_id, row, settle)
            return
        if await _unanswered(settle, row, found, "reconcile"):
            return
        if found is not None:
            await settle(NotificationStatus.DELIVERED, result=found)
            return
    obsolete = await _obsolete(services.store, row)
    if obsolete is not None:
        await settle(NotificationStatus.OBSOLETE, error=obsolete)
        return
    try:
        result = await _bounded(services, worker_id, row, notifier, notifier.send, note)
    except TransientError as exc:
        delay = (
            exc.retry_after
            if exc.retry_after is not None
            else min(60.0, 2.0 ** min(row["attempts"], 6))
        )
        await settle(NotificationStatus.QUEUED, error=repr(exc), delay=delay)
        return
    except Exception as exc:
        log.exception("notification %s failed", row["intent_id"])
        await settle(NotificationStatus.FAILED, error=repr(exc))
        return
    if await _unanswered(settle, row, result, "send"):
        return
    await settle(NotificationStatus.DELIVERED, result=result)


async def _bounded(
    services: Services,
    worker_id: str,
    row: Row,
    notifier: Notifier,
    call: Callable[[Notification], Any],
    note: Notification,
) -> Any:
    """`call(note)` (the notifier's send or reconcile) under the notification's claim, renewed
    while it runs, bounded by its notifier's send timeout (TIMED_OUT or STILL_RUNNING past it:
    see SEND_TIMEOUT), so that no provider holds the dispatcher for ever."""
    store, ttl, attempts = services.store, services.lease_ttl, int(row["attempts"])
    renew = functools.partial(
        store.renew_notification_claim,
        row["intent_id"],
        worker_id=worker_id,
        attempts=attempts,
        ttl=ttl,
    )
    timeout = float(getattr(notifier, "send_timeout", None) or SEND_TIMEOUT)
    what = f"notification {row['intent_id']}"
    async with claim_kept(what, renew, ttl, store.is_infrastructure):
        return await call_by_deadline(
            call,
            attempts,
            (note,),
            {},
            declared_timeout=timeout,
            asked_at=time.monotonic(),
            grace=timeout,
        )


async def _reconcile_timed_out(
    services: Services, worker_id: str, row: Row, settle: Callable[..., Awaitable[None]]
) -> None:
    """The notifier's async reconcile was cancelled at its timeout: counted, the claim left to
    lapse and the look asked again by the next dispatcher, until RECONCILE_TIMEOUTS of them
    went unanswered; then `in_doubt`, as a sync one still under way is."""
    count = await services.store.count_reconcile_timeout(
        row["intent_id"], worker_id=worker_id, attempts=row["attempts"]
    )
    if count is None:
        return  # its claim lapsed and was taken meanwhile: the taker's reconcile counts
    if count < RECONCILE_TIMEOUTS:
        log.warning(
            "notification %s: its reconcile did not answer within its send timeout (%d of %d); "
            "asked again once its claim lapsed",
            row["intent_id"],
            count,
            RECONCILE_TIMEOUTS,
        )
        return
    # Never sent on a guess: a provider that cannot say whether it has the message leaves it
    # to a person, as a dead sender's notification without a reconcile is.
    log.warning(
        "notification %s: its reconcile went unanswered %d times: in doubt", row["intent_id"], count
    )
    await settle(NotificationStatus.IN_DOUBT, error=f"its reconcile went unanswered {count} times")


async def _unanswered(
    settle: Callable[..., Awaitable[None]], row: Row, outcome: Any, call: str
) -> bool:
    """Whether the notifier's `call` ("send", "reconcile") did not answer within its bound; if
    so, the notification is left as SEND_TIMEOUT says."""
    if outcome is TIMED_OUT:
        # Nothing of the call runs any more: once the claim lapses, the next dispatcher asks
        # the notifier's reconcile, never sending it again on a guess.
        log.warning(
            "notification %s: its %s did not answer within its send timeout; it is reconciled "
            "once its claim lapsed",
            row["intent_id"],
            call,
        )
        return True
    if outcome is STILL_RUNNING:
        # Its thread can still deliver it (a send) or hold the provider (a reconcile, asked
        # again at every pass would pile such threads up): nobody may reconcile or resend it,
        # a person decides.
        log.warning("notification %s: its %s is still under way: in doubt", row["intent_id"], call)
        await settle(NotificationStatus.IN_DOUBT, error=f"its {call} outlived its timeout")
        return True
    return False


AFTER_REQUEST = 1.0
"""Seconds a wait's later notification waits for its request, still being sent, to settle."""


def _request_in_flight(row: Row, related: list[Row]) -> bool:
    """Whether this notifier's request about the same wait (among `related`, the wait's
    notifications) is being sent, claimed by another dispatcher. One still queued is not waited
    for: its wait answered, it goes out as `obsolete`, never posted."""
    return row["kind"] != "request" and any(
        r["kind"] == "request"
        and r["notifier"] == row["notifier"]
        and r["status"] == NotificationStatus.SENDING
        for r in related
    )


async def _obsolete(store: Store, row: Row) -> str | None:
    """Why a notification asking a person to act must not go out now, if it must not.

    Read just before sending: a wait answered (or a run ended) after this read still gets its
    message, as it would had the dispatcher been a moment quicker; the next one is dropped."""
    if row["kind"] not in ASKS or row["wait_id"] is None:
        return None
    wait = await store.get_wait(str(row["wait_id"]))
    if wait is None:
        return "its wait is gone"
    if wait["status"] != WaitStatus.PENDING:
        return f"its wait was {wait['status']} before it went out"
    run = await store.get_run(str(row["run_id"]))
    if run is None or run["status"] in OVER:
        ended = "gone" if run is None else run["status"]
        return f"its run was {ended} before it went out"
    return None


def _notification(row: Row, related: list[Row]) -> Notification:
    payload = loads(row["payload"])
    earlier = {
        r["kind"]: loads(r["result"])
        for r in related
        if r["notifier"] == row["notifier"] and r["status"] == NotificationStatus.DELIVERED
    }
    # What `notification_payload` wrote about the run and its wait.
    about = {k: payload[k] for k in ("job_id", "workflow", "wait")}
    return Notification(
        row["intent_id"],
        row["kind"],
        row["run_id"],
        **about,
        details=payload.get("details", {}),
        earlier=earlier,
    )


async def _settle(
    services: Services,
    worker_id: str,
    row: Row,
    status: NotificationStatus,
    *,
    result: Any = None,
    error: str | None = None,
    delay: float = 0.0,
    stopping: asyncio.Event | None = None,
) -> None:
    store = services.store

    async def write() -> None:
        async with store.transaction() as tx:
            settled = await store.settle_notification(
                tx,
                row["intent_id"],
                worker_id=worker_id,
                attempts=row["attempts"],
                status=status,
                result=dumps(result),
                error=error,
                delay=delay,
            )
            if settled is not None and status != NotificationStatus.QUEUED:
                about = {k: row[k] for k in ("intent_id", "notifier", "kind")}
                await store.add_event(
                    tx, row["run_id"], f"notification.{status}", about, worker_id=worker_id
                )

    # A message the notifier sent, its record lost to an outage, would be `in_doubt` once its
    # claim expired: the record is tried again through the outage (fenced by the claim), for
    # less long than an intent's, as the worker's sweep waits for it (a stop among others).
    what = f"notification {row['intent_id']}: {status}"
    await outlast(write, store.is_infrastructure, what, within=RECORD_OUTLAST, stop=stopping)
