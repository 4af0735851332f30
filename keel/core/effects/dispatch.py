"""Dispatching intents (the effect outbox): claimed like runs, rate-limited, retried, reconciled.

Every worker (and `keel dispatcher APP` alone) runs `dispatch`. A claim is a conditional update
under a new claim token with an expiry judged by the database's clock; every outcome is written
only under the token that claimed it, so a dispatcher that froze past its claim writes nothing.
Before the provider call the claim is checked once more, where the call is made; while the
call is under way it is renewed every third of its TTL, so a slow provider is not taken for a
dead dispatcher (a frozen or killed one stops renewing, and its claim lapses).

An intent found `sending` under an expired claim may or may not have reached the provider: as
the ledger does, Keel asks the effect's reconciler, retries under the same id if the provider
dedupes by key, or marks it `in_doubt` for a person. It is never resent on a guess. One
delivery, and how its outcome is written: keel.core.effects.delivery.

Rate limits are token buckets in the database, one per effect, shared by every dispatcher: a
dispatcher that finds the bucket empty leaves that effect alone until a token is due.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from typing import Any

from keel.core.codec import check_storable
from keel.core.effects.delivery import announce, deliver, encoded
from keel.core.effects.outbox import EFFECTS, IntentStatus, OutboxEffect
from keel.core.errors import IntentNotFound, IntentState, UsageError
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
        return 1 if effect.options.rate is not None else self.per_effect

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
                running.add(_start(services, worker_id, pacing, row, in_doubt, stopping))
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
    services: Services,
    worker_id: str,
    pacing: Pacing,
    row: Row,
    in_doubt: bool,
    stopping: asyncio.Event | None,
) -> asyncio.Task[None]:
    name = str(row["effect"])
    pacing._busy[name] += 1

    def free(_: asyncio.Task[None]) -> None:
        pacing._busy[name] -= 1

    task = asyncio.create_task(
        _delivered(services, worker_id, pacing.effects[name], row, in_doubt, stopping),
        name=f"keel-deliver-{row['intent_id']}",
    )
    task.add_done_callback(free)
    return task


async def _delivered(
    services: Services,
    worker_id: str,
    effect: OutboxEffect[Any, Any],
    row: Row,
    in_doubt: bool,
    stopping: asyncio.Event | None,
) -> None:
    """One delivery in its lane. Its outcome's record is retried through an outage
    (`infra.outlast`); a failure that outlasts that, or a stop, is logged here: its claim
    lapses and the intent is reconciled later."""
    try:
        await deliver(services, worker_id, effect, row, in_doubt, stopping)
    except Exception as exc:
        if services.store.is_infrastructure(exc):
            log.warning("intent %s: delivery interrupted: %r", row["intent_id"], exc)
        else:
            log.exception("intent %s: delivery failed", row["intent_id"])


RECORDING_HOLD = 0.5
"""Seconds an effect is left alone while this process records one of its intents' outcomes."""

_HELD: Any = object()
"""The candidate's effect has no token now: it is held, another effect may go."""


async def _claim(
    services: Services, worker_id: str, pacing: Pacing, ready: list[str]
) -> tuple[Row, bool] | None:
    store = services.store
    async with store.transaction() as tx:
        candidate = await store.intent_candidate(tx, ready)
        if candidate is None:
            return None
        effect = pacing.effects[candidate["effect"]]
        if candidate["intent_id"] in services.recording:
            # This process heard its outcome and is recording it (the database came back a
            # moment ago): not in doubt. Its effect waits a moment; the others go on.
            pacing.hold(effect.name, RECORDING_HOLD)
            return _HELD
        rate = effect.options.rate
        if rate is not None:
            wait = await store.take_rate_token(tx, effect.name, rate.per_second, rate.burst)
            if wait > 0:
                pacing.hold(effect.name, wait)
                return _HELD
        in_doubt = candidate["status"] == IntentStatus.SENDING
        row = await store.claim_intent(
            tx,
            candidate["intent_id"],
            worker_id=worker_id,
            ttl=services.lease_ttl,
            count=not in_doubt,
        )
    return row, in_doubt


# -- a person's actions on dead and in-doubt intents --------------------------------------------


async def retry(services: Services, intent_id: str, *, by: str | None = None) -> Row:
    """Deliver a dead intent again (its attempts from zero), e.g. once the provider is fixed."""
    store = services.store
    async with store.transaction() as tx:
        row = await _locked(store, tx, intent_id)
        if row["status"] != IntentStatus.DEAD:
            raise IntentState(
                f"intent {intent_id} is {row['status']}: only a dead intent is retried "
                "(an in-doubt one is resolved with --performed or --not-performed)"
            )
        reopened = await store.reopen_intent(tx, intent_id, IntentStatus.DEAD)
        assert reopened is not None
        await announce(store, tx, reopened, "outbox.retried", by=by)
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
    check_storable(result, "the result")
    store = services.store
    async with store.transaction() as tx:
        row = await _locked(store, tx, intent_id)
        state = row["status"]
        if state not in (IntentStatus.IN_DOUBT, IntentStatus.DEAD) or (
            state == IntentStatus.DEAD and not performed
        ):
            hint = (
                "retry it to deliver it again"
                if state == IntentStatus.DEAD
                else ("only an in-doubt or dead intent takes an answer")
            )
            raise IntentState(f"intent {intent_id} is {state}: {hint}")
        if performed:
            done = await store.resolve_intent_performed(tx, intent_id, state, encoded(result))
        else:
            done = await store.reopen_intent(tx, intent_id, state)
        assert done is not None
        await announce(store, tx, done, "outbox.resolved", performed=performed, by=by)
    services.wake()
    return done


async def _locked(store: Store, tx: Any, intent_id: str) -> Row:
    row = await store.lock_intent(tx, intent_id)
    if row is None:
        raise IntentNotFound(f"no outbox intent {intent_id!r}")
    return row


async def due_soon(services: Services) -> bool:
    """Whether this process's effects have intents still to deliver (a worker told to stop
    when idle delivers them first)."""
    if not EFFECTS:
        return False
    return await services.store.intents_undelivered(list(EFFECTS))
