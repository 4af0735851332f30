"""An execution that failed outside the graph's own code: what it leads to, in one command.

The graph's own failure (a node raised) ends the run failed at once: that is the executor's
`finish`. Any other failure of an execution is an attempt, counted here under its lease:

- an infrastructure fault (the database or the machine: `Store.is_infrastructure`) gives the
  run back to the queue, to resume from its last checkpoint at once on any worker that can
  reach the database;
- a crash (the executor, the saver, Keel itself) keeps the lease for a backoff, then lets it
  lapse: the next claim takes the run over with a new token, as after a dead worker;
- past its limit (`keel.core.infra.Attempts`), either ends the run failed (`runs.give_up`).
"""

from __future__ import annotations

import logging
from typing import Any

from keel.core import failures, logs
from keel.core.errors import LeaseLost
from keel.core.leases import LeaseEnd
from keel.core.lifecycle import Status
from keel.core.runs import give_up, transition
from keel.core.services import Services
from keel.core.store.base import Row, Tx
from keel.core.store.store import Lease, Store

# The executor's logger: these lines were always the executor's, and log filters name it.
log = logging.getLogger("keel.executor")


async def failed(
    services: Services, lease: Lease, exc: Exception, *, progressed: bool
) -> Status | LeaseEnd:
    """Count the failed execution of the run `lease` holds and say what comes next: given back
    (infrastructure), retried after a backoff (crash), or failed past the limit (the status
    it reached), or the run had moved on (its status). Infrastructure interruptions count in
    a row: one after a committed step (`progressed`) is the first again, so a long run through
    many outages is not failed for them. LeaseEnd.LOST if another worker holds the run now;
    LeaseEnd.RETRY if nothing could be recorded (the database is away: the lease expires)."""
    store, policy = services.store, services.attempts
    infra = store.is_infrastructure(exc)
    error = f"{type(exc).__name__}: {exc}"
    limit = policy.max_infra_retries if infra else policy.max_crashes
    who = (lease.worker_id, lease.run_id, lease.token)
    try:
        async with store.fenced(lease.run_id, lease.token) as tx:
            current = await store.read_run(tx, lease.run_id)
            assert current is not None
            if current["status"] != Status.RUNNING:
                return Status(current["status"])  # it had moved on (a wait was registered)
            attempt = await _count(store, tx, lease, current, infra, limit, progressed)
            data: dict[str, Any] = {
                "cause": "infrastructure" if infra else "crash",
                "attempt": attempt,
                "limit": limit,
                "error": error[:2000],
            }
            if attempt >= limit:
                data["failure"] = failures.describe(exc)  # the last attempt's evidence
                log.error(
                    "worker %s run %s: %s attempt %d of %d failed, giving up: %s",
                    *who[:2],
                    data["cause"],
                    attempt,
                    limit,
                    error,
                )
                await give_up(
                    store,
                    tx,
                    current,
                    data,
                    error=error,
                    worker_id=lease.worker_id,
                    token=lease.token,
                )
                return Status.FAILED
            await _go_on(services, tx, lease, current, data, infra)
        log.warning(
            "worker %s run %s (token %s): %s attempt %d of %d failed (%s); it will resume",
            *who,
            data["cause"],
            attempt,
            limit,
            error,
            exc_info=not infra,
            extra=logs.database_error(exc) if infra else None,
        )
    except LeaseLost:
        return LeaseEnd.LOST
    except Exception as second:
        # The database is still away: the lease expires after its TTL and the run resumes.
        log.warning(
            "worker %s run %s (token %s): %s; could not record it (%r): the lease expires",
            *who,
            error,
            second,
            extra=logs.database_error(second),
        )
    return LeaseEnd.RETRY


async def _count(
    store: Store, tx: Tx, lease: Lease, current: Row, infra: bool, limit: int, progressed: bool
) -> int:
    """The number of this failed attempt, counted on the run where the count is durable."""
    if infra:
        _, attempt = await store.count_failed_attempt(
            tx, lease.run_id, lease.token, crash=False, progressed=progressed
        )
        return attempt
    # A crash the run recovers from is counted by the takeover that follows the backoff
    # (claim_next counts every takeover, as after a dead worker); the last one is counted
    # here, where the run ends.
    attempt = int(current["crash_count"]) + 1
    if attempt >= limit:
        attempt, _ = await store.count_failed_attempt(tx, lease.run_id, lease.token, crash=True)
    return attempt


async def _go_on(
    services: Services, tx: Tx, lease: Lease, current: Row, data: dict[str, Any], infra: bool
) -> None:
    """The attempt's event, and the run resumed: queued at once (infrastructure), or its
    lease held for the backoff, then left to lapse (a crash)."""
    store = services.store
    delay = 0.0 if infra else services.attempts.delay(int(data["attempt"]))
    if not infra:
        data["retry_in"] = round(delay, 3)
    kind = "attempt.interrupted" if infra else "attempt.crashed"
    await store.add_event(
        tx, lease.run_id, kind, data, worker_id=lease.worker_id, token=lease.token
    )
    if not infra:
        await store.hold_lease_for(tx, lease.run_id, lease.token, delay)
        return
    await transition(
        store,
        tx,
        current,
        Status.QUEUED,
        worker_id=lease.worker_id,
        token=lease.token,
        event={"reason": "infrastructure fault"},
    )
    await store.notify_wake(tx, lease.run_id)
