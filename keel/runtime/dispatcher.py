"""The outbox dispatcher every worker runs beside its claim loop (and `keel dispatcher APP`
runs alone): it delivers user effect intents (keel.core.effects.dispatch) until told to stop."""

from __future__ import annotations

import asyncio
import logging

from keel.core import infra
from keel.core.effects import dispatch as effect_dispatch
from keel.core.services import Services
from keel.runtime import webhooks

log = logging.getLogger("keel.runtime.worker")  # the worker's lines, as they were
SAFETY_POLL_INTERVAL = 5.0
"""The longest a quiet worker sleeps without looking at the database (a NOTIFY it missed)."""
IDLE_OUTBOX_LOOK = 60.0
"""How often a quiet dispatcher with no intent pending looks anyway (a lost NOTIFY)."""


async def deliver_effects(
    services: Services,
    worker_id: str,
    stopping: asyncio.Event,
    poll: float = 0.2,
    *,
    wake: asyncio.Event | None = None,
    safety_poll: float = SAFETY_POLL_INTERVAL,
) -> None:
    """Deliver outbox intents until `stopping` is set: the dispatcher every worker runs (and
    `keel dispatcher APP` alone).

    Idle, it polls every `poll` seconds; given `wake` (set on PostgreSQL's NOTIFY, which a
    committed intent and a person's retry send) it is quiet instead: it sleeps until the next
    intent falls due by the database's clock, a NOTIFY, or `safety_poll` at the latest."""
    webhooks.DELIVERING.set(services)  # this task's deliveries sign with this App's settings
    pacing = effect_dispatch.Pacing()
    failures = 0
    idle = False  # the last pass delivered nothing
    while not stopping.is_set():
        try:
            if idle and wake is None and not await _due_now(services):
                # Polling (SQLite): a look is one read, where a claim is a write transaction
                # that takes the database's write lock, five times a second per worker.
                handled = 0
            else:
                handled = await effect_dispatch.dispatch(
                    services, worker_id, pacing, stopping=stopping
                )
            failures = 0
        except Exception as exc:
            failures += 1
            if services.store.is_infrastructure(exc):
                log.warning("outbox: database unavailable (%r); backing off", exc)
            else:
                log.exception("outbox dispatch failed; the next pass retries")
            handled, pause = 0, infra.backoff(failures, base=0.1, cap=5.0)
        else:
            # Busy: straight on. Idle: the next due token, or a short poll for new intents.
            pause = 0.0 if handled else min(poll, pacing.next_due() or poll)
            if not handled and wake is not None:
                pause = await _quiet_pause(services, pacing, safety_poll)
        idle = not handled
        if pause:
            waiting = [stopping] if wake is None else [stopping, wake]
            await _first_of(waiting, pause)
            if wake is not None:
                wake.clear()


async def _due_now(services: Services) -> bool:
    """Whether an intent is deliverable, or a sender's claim has expired, by the database's
    clock: what a claim would find (`intent_candidate`'s rows are among these)."""
    due = await services.store.intents_due_in()
    return due is not None and due <= 0


async def _quiet_pause(services: Services, pacing: effect_dispatch.Pacing, cap: float) -> float:
    """How long an idle quiet dispatcher sleeps: until an intent falls due (one read), a rate
    token it waits for comes back, or `cap`."""
    due = await services.store.intents_due_in()
    if due is None:
        # Nothing pending or being sent: only a NOTIFY (an intent committed, a person's retry,
        # the LISTEN connection back) brings work, so look rarely.
        return IDLE_OUTBOX_LOOK
    return min(cap, pacing.next_due() or cap, max(due, 0.01))


async def _first_of(events: list[asyncio.Event], seconds: float) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
