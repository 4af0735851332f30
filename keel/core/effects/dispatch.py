"""Delivering user effect intents: claimed like runs, rate-limited, retried, reconciled.

Every worker (and `keel dispatcher APP` alone) runs `dispatch`. A claim is a conditional update
under a new claim token with an expiry judged by the database's clock; every outcome is written
only under the token that claimed it, so a dispatcher that froze past its claim writes nothing.
Before the provider call the claim is checked once more, where the call is made; while the
call is under way it is renewed every third of its TTL, so a slow provider is not taken for a
dead dispatcher (a frozen or killed one stops renewing, and its claim lapses).

An intent found `sending` under an expired claim may or may not have reached the provider: as
the ledger does, Keel asks the effect's reconciler, retries under the same id if the provider
dedupes by key, or marks it `in_doubt` for a person. It is never resent on a guess.

Rate limits are token buckets in the database, one per effect, shared by every dispatcher: a
dispatcher that finds the bucket empty leaves that effect alone until a token is due.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from keel.core.codec import dumps, loads
from keel.core.effects.calls import (
    NOT_CALLED,
    STILL_RUNNING,
    TIMED_OUT,
    call_by_deadline,
    call_with_token,
)
from keel.core.effects.outbox import EFFECTS, IntentState, OutboxEffect, answer_waits
from keel.core.effects.rows import hold
from keel.core.errors import EffectConflict, IntentNotFound, UsageError
from keel.core.errors import IntentState as WrongState
from keel.core.faults import fault_point
from keel.core.runs import wake_after_wait
from keel.core.services import Services
from keel.core.store.base import Row
from keel.core.store.store import Store

log = logging.getLogger("keel.core.effects.dispatch")


DEFAULT_CONCURRENCY = 8
"""Deliveries one dispatcher makes at once (`KEEL_OUTBOX_CONCURRENCY`)."""


class Pacing:
    """One dispatcher's view of which effects it may claim now: rate buckets found empty, and
    its lanes. It delivers up to `concurrency` intents at once and at most `per_effect` of one
    effect (default: half of them), so one slow effect cannot hold every lane."""

    def __init__(
        self,
        effects: dict[str, OutboxEffect[Any, Any]] | None = None,
        *,
        concurrency: int | None = None,
        per_effect: int | None = None,
    ) -> None:
        self.effects = EFFECTS if effects is None else effects
        if concurrency is None:
            concurrency = int(os.environ.get("KEEL_OUTBOX_CONCURRENCY") or DEFAULT_CONCURRENCY)
        if concurrency < 1 or (per_effect is not None and per_effect < 1):
            raise UsageError("an outbox dispatcher needs at least one lane (concurrency >= 1)")
        self.concurrency = concurrency
        self.per_effect = per_effect or max(1, concurrency // 2)
        self._until: dict[str, float] = {}
        self._busy: Counter[str] = Counter()

    def ready(self) -> list[str]:
        now = time.monotonic()
        return [
            name
            for name, effect in self.effects.items()
            if self._until.get(name, 0.0) <= now and self._busy[name] < self.lanes(effect)
        ]

    def lanes(self, effect: OutboxEffect[Any, Any]) -> int:
        """How many of `effect`'s deliveries may run at once here. A rate-limited effect gets
        one: its token is taken at the claim, and calls started side by side would reach the
        provider bunched past the rate it promised."""
        return 1 if effect.rate is not None else self.per_effect

    def hold(self, name: str, seconds: float) -> None:
        self._until[name] = time.monotonic() + seconds

    def next_due(self) -> float:
        """Seconds until a held effect may be claimed again (0: one is ready)."""
        now = time.monotonic()
        return max(0.0, min((t - now for t in self._until.values()), default=0.0))


IN_FLIGHT_LOOK = 1.0
"""While deliveries are under way and nothing else was due, how often a dispatcher looks again
for new intents (a slow delivery holds its lane, not the others)."""


async def dispatch(
    services: Services,
    worker_id: str,
    pacing: Pacing,
    limit: int = 50,
    stopping: asyncio.Event | None = None,
) -> int:
    """Claim and settle up to `limit` due intents, up to `pacing.concurrency` at once; return
    how many were handled. Every delivery started here has ended when it returns: one that
    fails is logged and left to its claim's expiry, never cancelling the others; a claim that
    fails (the database went away) is raised once the deliveries under way have ended. Once
    `stopping` is set (the worker drains) nothing more is claimed."""
    handled = 0
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            claimed = None
            stopped = stopping is not None and stopping.is_set()
            if not stopped and handled < limit and len(running) < pacing.concurrency:
                ready = pacing.ready()
                try:
                    claimed = await _claim(services, worker_id, pacing, ready) if ready else None
                except Exception:
                    if running:
                        await asyncio.wait(running)
                    raise
                if claimed is _HELD:
                    continue
            if claimed is not None:
                row, in_doubt = claimed
                running.add(_start(services, worker_id, pacing, row, in_doubt))
                handled += 1
                continue
            if not running:
                return handled
            # Full, or nothing due now: wait for a lane to free up, looking again now and
            # then for intents that fell due meanwhile.
            done, _ = await asyncio.wait(
                running, timeout=IN_FLIGHT_LOOK, return_when=asyncio.FIRST_COMPLETED
            )
            running -= done
    finally:
        # Only a cancel (the worker stops now) gets here with deliveries under way.
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def _start(
    services: Services, worker_id: str, pacing: Pacing, row: Row, in_doubt: bool
) -> asyncio.Task[None]:
    name = str(row["effect"])
    pacing._busy[name] += 1

    def free(_: asyncio.Task[None]) -> None:
        pacing._busy[name] -= 1

    task = asyncio.create_task(
        _delivered(services, worker_id, pacing.effects[name], row, in_doubt),
        name=f"keel-deliver-{row['intent_id']}",
    )
    task.add_done_callback(free)
    return task


async def _delivered(
    services: Services, worker_id: str, effect: OutboxEffect[Any, Any], row: Row, in_doubt: bool
) -> None:
    """One delivery in its lane: a failure of its own (the database went away while it
    recorded its outcome) is logged; its claim lapses and the intent is reconciled later."""
    try:
        await _deliver(services, worker_id, effect, row, in_doubt)
    except Exception as exc:
        if services.store.is_infrastructure(exc):
            log.warning("intent %s: delivery interrupted: %r", row["intent_id"], exc)
        else:
            log.exception("intent %s: delivery failed", row["intent_id"])


_HELD: Any = object()
"""The candidate's effect has no token now: it is held, another effect may go."""


async def _claim(
    services: Services, worker_id: str, pacing: Pacing, ready: list[str]
) -> tuple[Row, bool] | None:
    store = services.store
    async with store.transaction() as tx:
        candidate = await store.effect_intent_candidate(tx, ready)
        if candidate is None:
            return None
        effect = pacing.effects[candidate["effect"]]
        if effect.rate is not None:
            wait = await store.take_rate_token(
                tx, effect.name, effect.rate.per_second, effect.rate.burst
            )
            if wait > 0:
                pacing.hold(effect.name, wait)
                return _HELD
        in_doubt = candidate["status"] == IntentState.SENDING
        row = await store.claim_effect_intent(
            tx,
            candidate["intent_id"],
            worker_id=worker_id,
            ttl=services.lease_ttl,
            count=not in_doubt,
        )
    return row, in_doubt


async def _deliver(
    services: Services, worker_id: str, effect: OutboxEffect[Any, Any], row: Row, in_doubt: bool
) -> None:
    intent_id = str(row["intent_id"])
    stored = loads(row["args"])
    args, kwargs = tuple(stored["args"]), dict(stored["kwargs"])
    token = int(row["claim_token"])
    if in_doubt:
        if effect.reconcile is not None:
            try:
                found = await call_with_token(
                    effect.reconcile, token, *args, idempotency_key=intent_id, **kwargs
                )
            except EffectConflict as conflict:
                await _settle(
                    services, worker_id, row, IntentState.IN_DOUBT, error=_conflict(conflict)
                )
                return
            except Exception as exc:
                # Can't tell yet: the claim expires and the next dispatcher asks again.
                log.warning("reconciler of %s failed for %s: %r", effect.name, intent_id, exc)
                return
            if found is not None:
                await _settle(
                    services,
                    worker_id,
                    row,
                    IntentState.DELIVERED,
                    result=found,
                    event="outbox.reconciled",
                )
                return
            # The provider has no such delivery: it never happened, deliver it now.
        elif not effect.provider_idempotent:
            log.warning(
                "intent %s may have been delivered by a dead dispatcher: in doubt", intent_id
            )
            await _settle(
                services,
                worker_id,
                row,
                IntentState.IN_DOUBT,
                error="its dispatcher died mid-delivery; a person must say whether "
                "it reached the provider",
            )
            return
    # An in-doubt reclaim counts its call here (its claim did not): calls that keep timing out
    # end dead, never in an endless deliver-timeout-reconcile round.
    attempts = int(row["attempts"]) + int(in_doubt)
    if attempts > int(row["max_attempts"]):
        why = f"gave up after {attempts - 1} attempts (the last ones went unanswered)"
        await _settle(services, worker_id, row, IntentState.DEAD, error=why)
        return
    fault_point("outbox.before_call", effect.name)
    call_timeout = effect.timeout_for(services)
    asked_at = await services.store.arm_effect_intent(
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
        async with _claim_renewed(services, intent_id, token):
            result = await call_by_deadline(
                effect.fn,
                token,
                args,
                {**kwargs, "idempotency_key": intent_id},
                declared_timeout=effect.timeout if effect.timeout_declared else None,
                asked_at=asked_at,
                grace=hold(call_timeout),
            )
    except EffectConflict as conflict:
        await _settle(services, worker_id, row, IntentState.IN_DOUBT, error=_conflict(conflict))
        return
    except Exception as exc:
        took = round(time.monotonic() - started, 6)
        error = f"{type(exc).__name__}: {exc}"[:2000]
        if isinstance(exc, effect.retry.on) and attempts < int(row["max_attempts"]):
            delay = effect.retry.delay(attempts, exc)
            log.info(
                "outbox.retry %s %s attempt=%d in %.2fs: %s",
                effect.name,
                intent_id,
                attempts,
                delay,
                error,
                extra={"event": "outbox.retry", "duration": took},
            )
            await _settle(services, worker_id, row, IntentState.PENDING, error=error, delay=delay)
            return
        transient = isinstance(exc, effect.retry.on)
        why = f"gave up after {attempts} attempts" if transient else "permanent failure"
        log.warning(
            "outbox.dead %s %s (%s): %s",
            effect.name,
            intent_id,
            why,
            error,
            extra={"event": "outbox.dead", "duration": took},
        )
        await _settle(services, worker_id, row, IntentState.DEAD, error=f"{why}: {error}")
        return
    if result is STILL_RUNNING:
        # Its thread still waits on the provider well past its timeout: no dispatcher may ask
        # or resend while it can still land, so a person decides.
        log.warning("intent %s: its call is still under way past its deadline", intent_id)
        await _settle(
            services,
            worker_id,
            row,
            IntentState.IN_DOUBT,
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
            await services.store.release_effect_claim(intent_id, token)
        except Exception as exc:  # the claim lapses on its own: later, never wrongly
            log.warning("intent %s: claim %d not released: %r", intent_id, token, exc)
        return
    fault_point("outbox.after_call", effect.name)
    await _settle(services, worker_id, row, IntentState.DELIVERED, result=result)
    fault_point("outbox.after_settle", effect.name)


@asynccontextmanager
async def _claim_renewed(services: Services, intent_id: str, token: int) -> AsyncIterator[None]:
    """Keep the claim on `intent_id` for as long as the body (the provider call) runs."""

    async def renew() -> None:
        ttl = services.lease_ttl
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                held = await services.store.renew_effect_claim(intent_id, token, ttl)
            except Exception as exc:
                # Never the call's failure: at worst the claim lapses and the intent is
                # reconciled as a dead dispatcher's would be.
                if not services.store.is_infrastructure(exc):
                    log.exception("intent %s: claim %d renewal failed", intent_id, token)
                    return
                log.warning("intent %s: claim %d not renewed: %s", intent_id, token, exc)
                continue
            if not held:
                # Another dispatcher reconciles it; this call's outcome will not be recorded.
                log.warning("intent %s: claim %d lapsed during the call", intent_id, token)
                return

    renewing = asyncio.create_task(renew(), name=f"keel-claim-{intent_id}")
    try:
        yield
    finally:
        renewing.cancel()
        with suppress(asyncio.CancelledError):
            await renewing


def _conflict(conflict: EffectConflict) -> str:
    """An in-doubt intent's error: what the provider reported, with its records."""
    records = f"; records: {_encoded(conflict.records)}" if conflict.records else ""
    return f"the provider reports conflicting outcomes for this id: {conflict}{records}"[:4000]


def _encoded(result: Any) -> str:
    try:
        return dumps(result)
    except (TypeError, ValueError):
        return dumps({"repr": repr(result)})


async def _settle(
    services: Services,
    worker_id: str,
    row: Row,
    state: IntentState,
    *,
    result: Any = None,
    error: str | None = None,
    delay: float = 0.0,
    event: str | None = None,
) -> None:
    store = services.store
    async with store.transaction() as tx:
        settled = await store.settle_effect_intent(
            tx,
            row["intent_id"],
            claim_token=int(row["claim_token"]),
            status=state,
            result=_encoded(result) if state != IntentState.PENDING else row["result"],
            error=error,
            delay=delay,
        )
        if settled is None:
            log.warning(
                "intent %s: claim lost before its outcome (%s) was recorded",
                row["intent_id"],
                state,
            )
            return
        if state == IntentState.PENDING:
            return  # a retry later: the timeline hears of the outcome, not of every attempt
        await _announce(store, tx, settled, event or f"outbox.{state}", worker_id=worker_id)
    services.wake()


async def _announce(store: Store, tx: Any, intent: Row, kind: str, **data: Any) -> None:
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


# -- a person's actions on dead and in-doubt intents --------------------------------------------


async def retry(services: Services, intent_id: str, *, by: str | None = None) -> Row:
    """Deliver a dead intent again (its attempts from zero), e.g. once the provider is fixed."""
    store = services.store
    async with store.transaction() as tx:
        row = await _locked(store, tx, intent_id)
        if row["status"] != IntentState.DEAD:
            raise WrongState(
                f"intent {intent_id} is {row['status']}: only a dead intent is retried "
                "(an in-doubt one is resolved with --performed or --not-performed)"
            )
        reopened = await store.reopen_effect_intent(tx, intent_id, IntentState.DEAD)
        assert reopened is not None
        await _announce(store, tx, reopened, "outbox.retried", by=by)
    services.wake()
    return reopened


async def resolve(
    services: Services,
    intent_id: str,
    *,
    performed: bool,
    result: Any = None,
    by: str | None = None,
) -> Row:
    """A person's answer on an in-doubt (or dead) intent: it reached the provider (delivered,
    never sent again) or it did not (in doubt: delivered now under the same id)."""
    store = services.store
    async with store.transaction() as tx:
        row = await _locked(store, tx, intent_id)
        state = row["status"]
        if state not in (IntentState.IN_DOUBT, IntentState.DEAD) or (
            state == IntentState.DEAD and not performed
        ):
            hint = (
                "retry it to deliver it again"
                if state == IntentState.DEAD
                else ("only an in-doubt or dead intent takes an answer")
            )
            raise WrongState(f"intent {intent_id} is {state}: {hint}")
        if performed:
            done = await store.resolve_effect_intent_performed(
                tx, intent_id, state, _encoded(result)
            )
        else:
            done = await store.reopen_effect_intent(tx, intent_id, state)
        assert done is not None
        await _announce(store, tx, done, "outbox.resolved", performed=performed, by=by)
    services.wake()
    return done


async def _locked(store: Store, tx: Any, intent_id: str) -> Row:
    row = await store.lock_effect_intent(tx, intent_id)
    if row is None:
        raise IntentNotFound(f"no outbox intent {intent_id!r}")
    return row


async def due_soon(services: Services) -> bool:
    """Whether this process's effects have intents still to deliver (a worker told to stop
    when idle delivers them first)."""
    if not EFFECTS:
        return False
    return await services.store.effects_undelivered(list(EFFECTS))
