"""Fenced leases: claim (with a new token at every takeover), renew, release.

A claim is one transaction: pick the oldest claimable run (PostgreSQL: FOR UPDATE SKIP LOCKED,
so concurrent workers never pick the same row), bump its token and set the expiry. Claiming
also reaps: a `running` run whose lease expired is claimable, so a dead worker's runs are
picked up by whoever claims next.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from keel.core.faults import fault_point
from keel.core.lifecycle import Status
from keel.core.runs import transition
from keel.core.store.base import Row
from keel.core.store.store import Lease, Store


async def claim(
    store: Store,
    worker_id: str,
    workflows: Iterable[str],
    now: float,
    ttl: float,
    limits: Mapping[str, int] | None = None,
) -> tuple[Lease, Row] | None:
    """Take the oldest claimable run; `limits` caps running runs per workflow key, cluster-wide."""
    keys = sorted(workflows)
    async with store.db.transaction() as tx:
        startable = keys
        if limits:
            await tx.one("claim_lock")
            running = {r["workflow_key"]: int(r["n"]) for r in await tx.all("running_counts")}
            startable = [k for k in keys if running.get(k, 0) < limits.get(k, 1 << 30)]
        candidate = await tx.one(
            "claim_candidate",
            {"now": now, "workflows": json.dumps(keys), "startable": json.dumps(startable)},
        )
        if candidate is None:
            return None
        row = await tx.one(
            "claim_run",
            {
                "run_id": candidate["run_id"],
                "worker_id": worker_id,
                "expires_at": now + ttl,
                "now": now,
            },
        )
        assert row is not None
        token = int(row["lease_token"])
        takeover = candidate["status"] == Status.RUNNING
        await store.add_event(
            tx,
            row["run_id"],
            "lease.takeover" if takeover else "lease.claimed",
            now,
            {"previous_owner": candidate["lease_owner"], "expires_at": now + ttl}
            if takeover
            else {"expires_at": now + ttl},
            worker_id=worker_id,
            token=token,
        )
    return Lease(row["run_id"], worker_id, token), row


async def renew(store: Store, leases: Iterable[Lease], now: float, ttl: float) -> list[Lease]:
    """Extend the given leases; return those this worker no longer holds."""
    lost = []
    fault_point("lease.renew")
    async with store.db.transaction() as tx:
        for lease in leases:
            row = await tx.one(
                "renew_lease",
                {
                    "run_id": lease.run_id,
                    "lease_token": lease.token,
                    "expires_at": now + ttl,
                    "now": now,
                },
            )
            if row is None:
                lost.append(lease)
    return lost


async def release(store: Store, lease: Lease, now: float, reason: str) -> None:
    """Give a running run back to the queue (graceful shutdown) so another worker resumes it."""
    async with store.fenced(lease.run_id, lease.token) as tx:
        run = await tx.one("get_run", {"run_id": lease.run_id})
        assert run is not None
        if run["status"] != Status.RUNNING:
            return
        await transition(
            store,
            tx,
            run,
            Status.QUEUED,
            now,
            worker_id=lease.worker_id,
            token=lease.token,
            event={"reason": reason},
        )
