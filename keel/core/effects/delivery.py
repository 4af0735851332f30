"""One delivery of an intent, and how its outcome is written.

`deliver` makes the provider call of one claimed intent (keel.core.effects.dispatch claims it):
reconciled first if an earlier dispatcher may have sent it, bounded by the effect's timeout,
its claim renewed while the call is under way; `settle` writes the outcome under the claim
that made it, and `announce` puts it on the run's timeline and resumes a run awaiting it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

from keel.core.codec import dumps, loads
from keel.core.effects.calls import (
    NOT_CALLED,
    STILL_RUNNING,
    TIMED_OUT,
    call_by_deadline,
    call_with_token,
)
from keel.core.effects.outbox import IntentStatus, OutboxEffect, answer_waits
from keel.core.effects.rows import hold
from keel.core.errors import EffectConflict
from keel.core.faults import fault_point
from keel.core.infra import outlast
from keel.core.leases import claim_kept
from keel.core.runs import wake_after_wait
from keel.core.services import Services
from keel.core.store.base import Row
from keel.core.store.store import Store

log = logging.getLogger("keel.core.effects.dispatch")  # the dispatcher's log, as before


async def deliver(
    services: Services,
    worker_id: str,
    effect: OutboxEffect[Any, Any],
    row: Row,
    in_doubt: bool,
    stopping: asyncio.Event | None = None,
) -> None:
    """Deliver one claimed intent and record the outcome (through an outage, until `stopping`)."""
    outcome = functools.partial(settle, services, worker_id, row, stopping=stopping)
    intent_id = str(row["intent_id"])
    stored = loads(row["args"])
    args, kwargs = tuple(stored["args"]), dict(stored["kwargs"])
    token = int(row["claim_token"])
    if in_doubt:
        if effect.options.reconcile is not None:
            try:
                found = await call_with_token(
                    effect.options.reconcile, token, *args, idempotency_key=intent_id, **kwargs
                )
            except EffectConflict as conflict:
                await outcome(IntentStatus.IN_DOUBT, error=_conflict(conflict))
                return
            except Exception as exc:
                # Can't tell yet: the claim expires and the next dispatcher asks again.
                log.warning("reconciler of %s failed for %s: %r", effect.name, intent_id, exc)
                return
            if found is not None:
                await outcome(
                    IntentStatus.DELIVERED,
                    result=found,
                    event="outbox.reconciled",
                )
                return
            # The provider has no such delivery: it never happened, deliver it now.
        elif not effect.options.provider_idempotent:
            log.warning(
                "intent %s may have been delivered by a dead dispatcher: in doubt", intent_id
            )
            await outcome(
                IntentStatus.IN_DOUBT,
                error="its dispatcher died mid-delivery; a person must say whether "
                "it reached the provider",
            )
            return
    # An in-doubt reclaim counts its call here (its claim did not): calls that keep timing out
    # end dead, never in an endless deliver-timeout-reconcile round.
    attempts = int(row["attempts"]) + int(in_doubt)
    if attempts > int(row["max_attempts"]):
        why = f"gave up after {attempts - 1} attempts (the last ones went unanswered)"
        await outcome(IntentStatus.DEAD, error=why)
        return
    fault_point("outbox.before_call", effect.name)
    call_timeout = effect.options.timeout_for(services)
    asked_at = await services.store.arm_intent(
        intent_id, token, hold(call_timeout), count=int(in_doubt)
    )
    if asked_at is None:
        log.warning(
            "intent %s: claim %d lost (or its answer came too late) before the call; "
            "not delivered here",
            intent_id,
            token,
        )
        return
    started = time.monotonic()
    try:
        store, ttl = services.store, services.lease_ttl
        renew = functools.partial(store.renew_intent_claim, intent_id, token, ttl)
        async with claim_kept(
            f"intent {intent_id} claim {token}", renew, ttl, store.is_infrastructure
        ):
            result = await call_by_deadline(
                effect.fn,
                token,
                args,
                {**kwargs, "idempotency_key": intent_id},
                declared_timeout=effect.options.timeout,
                asked_at=asked_at,
                grace=hold(call_timeout),
            )
    except EffectConflict as conflict:
        await outcome(IntentStatus.IN_DOUBT, error=_conflict(conflict))
        return
    except Exception as exc:
        took = round(time.monotonic() - started, 6)
        error = f"{type(exc).__name__}: {exc}"[:2000]
        if isinstance(exc, effect.options.retry.on) and attempts < int(row["max_attempts"]):
            delay = effect.options.retry.delay(attempts, exc)
            log.info(
                "outbox.retry %s %s attempt=%d in %.2fs: %s",
                effect.name,
                intent_id,
                attempts,
                delay,
                error,
                extra={"event": "outbox.retry", "duration": took},
            )
            await outcome(IntentStatus.PENDING, error=error, delay=delay)
            return
        transient = isinstance(exc, effect.options.retry.on)
        why = f"gave up after {attempts} attempts" if transient else "permanent failure"
        log.warning(
            "outbox.dead %s %s (%s): %s",
            effect.name,
            intent_id,
            why,
            error,
            extra={"event": "outbox.dead", "duration": took},
        )
        await outcome(IntentStatus.DEAD, error=f"{why}: {error}")
        return
    if result is STILL_RUNNING:
        # Its thread still waits on the provider well past its timeout: no dispatcher may ask
        # or resend while it can still land, so a person decides.
        log.warning("intent %s: its call is still under way past its deadline", intent_id)
        await outcome(
            IntentStatus.IN_DOUBT,
            error=f"its call was still under way {call_timeout + hold(call_timeout):g}s after "
            "it started; a person must say whether it reached the provider",
        )
        return
    if result is TIMED_OUT or result is NOT_CALLED:
        # Unknown (or never called: its deadline was spent before the call). The claim ends;
        # past the call's deadline a dispatcher reconciles it as it would a dead one's, never
        # resending on a guess.
        log.warning(
            "outbox.timed_out %s %s: %s; it is reconciled once its deadline has passed",
            effect.name,
            intent_id,
            "not called, its deadline was spent"
            if result is NOT_CALLED
            else f"no answer within {call_timeout:g}s, its outcome is unknown",
            extra={"event": "outbox.timed_out", "duration": round(time.monotonic() - started, 6)},
        )
        try:
            await services.store.release_intent_claim(intent_id, token)
        except Exception as exc:  # the claim lapses on its own: later, never wrongly
            log.warning("intent %s: claim %d not released: %r", intent_id, token, exc)
        return
    fault_point("outbox.after_call", effect.name)
    await outcome(IntentStatus.DELIVERED, result=result)
    fault_point("outbox.after_settle", effect.name)


def _conflict(conflict: EffectConflict) -> str:
    """An in-doubt intent's error: what the provider reported, with its records."""
    records = f"; records: {encoded(conflict.records)}" if conflict.records else ""
    return f"the provider reports conflicting outcomes for this id: {conflict}{records}"[:4000]


def encoded(result: Any) -> str:
    try:
        return dumps(result)
    except (TypeError, ValueError):
        return dumps({"repr": repr(result)})


async def settle(
    services: Services,
    worker_id: str,
    row: Row,
    state: IntentStatus,
    *,
    result: Any = None,
    error: str | None = None,
    delay: float = 0.0,
    event: str | None = None,
    stopping: asyncio.Event | None = None,
) -> None:
    store = services.store

    async def write() -> bool:
        async with store.transaction() as tx:
            settled = await store.settle_intent(
                tx,
                row["intent_id"],
                claim_token=int(row["claim_token"]),
                status=state,
                result=encoded(result) if state != IntentStatus.PENDING else row["result"],
                error=error,
                delay=delay,
            )
            if settled is None:  # (or an earlier try committed, and its reply was lost)
                log.warning(
                    "intent %s: claim lost before its outcome (%s) was recorded",
                    row["intent_id"],
                    state,
                )
                return False
            if state == IntentStatus.PENDING:
                return False  # a retry later: the timeline hears of the outcome, not of attempts
            await announce(store, tx, settled, event or f"outbox.{state}", worker_id=worker_id)
            return True

    # Through an outage, not past it: the claim's token fences the write, so a dispatcher that
    # reclaimed the intent meanwhile (its deadline passed) keeps it, and this writes nothing.
    # This process's own dispatchers leave it alone until then (`recording`): for them the
    # answer is here, not in doubt.
    intent_id = str(row["intent_id"])
    services.recording.add(intent_id)
    try:
        what = f"intent {intent_id}: {state}"
        recorded = await outlast(write, store.is_infrastructure, what, stop=stopping)
    finally:
        services.recording.discard(intent_id)
    if recorded:
        services.wake()  # the outcome (and any run awaiting it) is there to see


async def announce(store: Store, tx: Any, intent: Row, kind: str, **data: Any) -> None:
    """The intent's timeline event, and its run resumed if it awaits this outcome."""
    run = await store.lock_run(tx, intent["run_id"])
    if run is None:
        return  # pruned: the intent outlived its run
    worker_id = data.pop("worker_id", None)
    await store.add_event(
        tx,
        intent["run_id"],
        kind,
        {
            "intent_id": intent["intent_id"],
            "effect": intent["effect"],
            **data,
            **({"error": intent["error"]} if intent["error"] else {}),
        },
        worker_id=worker_id,
    )
    if await answer_waits(store, tx, intent):
        await wake_after_wait(
            store,
            tx,
            run,
            decision=None,
            cause={"intent_id": intent["intent_id"], "outcome": intent["status"]},
        )
