"""The store's queries on leases, fencing and workers (part of `Store`).

Every write a run makes goes through `fenced()`: one transaction that first reads the run's
lease token and raises LeaseLost if another worker has taken the run since. On PostgreSQL the
read is `FOR SHARE`: a takeover's claim skips the row (SKIP LOCKED) while a write holds it and
takes it at a later pass, so no write can commit under a token that was already replaced; on
SQLite the whole transaction runs under BEGIN IMMEDIATE.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from keel.core import logs
from keel.core.clock import live_within
from keel.core.errors import LeaseLost, RunNotFound, SlowDatabase
from keel.core.store.base import Connector, Later, Row, Tx
from keel.core.store.run_queries import committed


@dataclass(frozen=True)
class Due:
    """What falls due for an idle worker, in seconds from now by the database's clock (0: it
    is already past; None: nothing of that kind is pending)."""

    queued: bool
    """A run of the worker's workflows is queued."""
    lease_in: float | None
    """Until the earliest lease of a running run of its workflows expires (a takeover)."""
    sweep_in: float | None
    """Until a wait's deadline or stage, or an outbox delivery, falls due."""


class LeaseQueries:
    db: Connector

    # -- fencing --------------------------------------------------------------------------------

    @asynccontextmanager
    async def fenced(self, run_id: str, token: int) -> AsyncIterator[Tx]:
        with committed():
            async with self.db.transaction() as tx:
                await self.check_fence(tx, run_id, token)
                yield tx

    @staticmethod
    async def fence_step(tx: Tx, run_id: str, token: int) -> Later:
        """The fence of a step transaction, sent without waiting: a stale token aborts the
        transaction (the connector raises LeaseLost at its commit). The result, awaited after
        the commit, is the run's row with its cancel flag."""
        later = await tx.send("fence_step", {"run_id": run_id, "lease_token": token})

        async def row() -> Row:
            found = await later()
            if found is None:
                raise RunNotFound(f"no run {run_id!r}")
            return found

        return row

    @staticmethod
    async def check_fence(tx: Tx, run_id: str, token: int) -> Row:
        return _held_by(await tx.one("fence", {"run_id": run_id}), run_id, token)

    async def check_token(self, run_id: str, token: int) -> Row:
        """The run's lease row if `token` is its current token, else RunNotFound or LeaseLost
        (a read: why a fenced single statement wrote nothing)."""
        async with self.db.read() as tx:
            return _held_by(await tx.one("lease_held", {"run_id": run_id}), run_id, token)

    async def check_lease_held(self, run_id: str, token: int) -> Row:
        """Raise LeaseLost unless `token` holds the run, its lease has not expired (by the
        database's clock), and the answer came back soon enough to act on (`live_within`: a
        reply a partition held past the lease's remainder says nothing about now).

        A read outside any write transaction: the last look before something that no
        transaction can fence (a provider call, a rename), so it narrows the window a frozen
        worker has, rather than closing it.
        """
        asked_at = time.monotonic()
        async with self.db.read() as tx:
            row = _held_by(await tx.one("lease_held", {"run_id": run_id}), run_id, token)
        if not row["live"]:
            # Not taken over yet, but takeable: a call now could race the next owner's.
            raise LeaseLost(f"run {run_id}: the lease of token {token} has expired")
        left = float(row["lease_left"])
        if not live_within(left, asked_at):
            raise SlowDatabase(
                f"run {run_id}: the lease of token {token} was live with {left:.1f}s left, but "
                f"the answer took {time.monotonic() - asked_at:.1f}s to arrive: too late to act on"
            )
        return row

    # -- failed attempts ------------------------------------------------------------------------

    @staticmethod
    async def count_failed_attempt(
        tx: Tx, run_id: str, token: int, *, crash: bool, progressed: bool = False
    ) -> tuple[int, int]:
        """One more crashed (`crash`) or infrastructure-interrupted attempt; the run's counts
        of both afterwards. `progressed`: the failed execution committed a step, so its
        interruption is the first of a new row (infra_retries counts them in a row)."""
        row = await tx.one(
            "count_failed_attempt",
            {
                "run_id": run_id,
                "lease_token": token,
                "crash": int(crash),
                "infra": int(not crash),
                "progressed": int(progressed),
            },
        )
        if row is None:
            raise LeaseLost(f"run {run_id}: lease token {token} is stale")
        return int(row["crash_count"]), int(row["infra_retries"])

    @staticmethod
    async def hold_lease_for(tx: Tx, run_id: str, token: int, delay: float) -> None:
        """Keep the lease `delay` seconds from now by the database's clock, then let it lapse."""
        await tx.execute(
            "hold_lease_until", {"run_id": run_id, "lease_token": token, "delay": delay}
        )

    @staticmethod
    async def loop_blocks(tx: Tx, run_id: str) -> list[Row]:
        """The run's latest `loop.blocked` and `loop.unblocked` events (kind, lease_token,
        worker_id, at, data as JSON), newest first, each with the database's `now`."""
        return await tx.all("loop_blocks", {"run_id": run_id})

    # -- claims ---------------------------------------------------------------------------------

    async def claim_next(
        self, worker_id: str, workflows: list[str], ttl: float, limits: dict[str, int]
    ) -> Row | None:
        """Claim the oldest claimable run and record the claim on its timeline, in one
        statement (one call on SQLite): queued with a key in `workflows` and below its limit in
        `limits`, or running under a lease expired by the database's clock (a takeover, which
        counts one crashed attempt). The lease is `ttl` seconds of the database's clock under a
        new token. The row has the run's columns after the claim, `previous_status`,
        `previous_owner` and `first_claim` (1: the run never ran before, so it has no
        checkpoint); None if nothing is claimable.

        Without limits the claim is its own transaction. With limits, PostgreSQL serializes
        claims (an advisory lock) so that no two count the same running runs (SQLite's write
        lock already does): `claim_with`'s two statements, one message."""
        started = time.monotonic()
        if limits:
            claimed = await self.db.run_transaction(
                self.claim_with(worker_id, workflows, ttl, limits)
            )
            row = await claimed()
        else:
            row = await self.db.single(
                "claim_next", self._claim_params(worker_id, workflows, ttl, limits)
            )
        self.log_claim(row, worker_id, started)
        return row

    async def claim_batch(
        self,
        worker_id: str,
        workflows: list[str],
        ttl: float,
        limits: dict[str, int],
        count: int,
    ) -> list[Row]:
        """Up to `count` claims in one transaction and one call (on PostgreSQL one message, one
        round trip, one commit): `claim_next` `count` times, each seeing the runs the earlier
        ones took (its own transaction's writes), so none takes a run twice, and each counting
        them against the workflow's limit. The claimed rows, oldest first; fewer than `count`
        when fewer were claimable. A worker facing a backlog fills its free slots this way
        rather than with a claim (and a commit) per slot."""
        if count <= 1:
            row = await self.claim_next(worker_id, workflows, ttl, limits)
            return [] if row is None else [row]
        started = time.monotonic()
        params = self._claim_params(worker_id, workflows, ttl, limits)

        async def claims(tx: Tx) -> list[Later]:
            if limits:
                await tx.execute("claim_lock")
            sent: list[Later] = []
            for _ in range(count):
                sent.append(later := await tx.send("claim_next", params))
                # Run one by one (SQLite), the claims stop at the first that finds nothing:
                # the rest would find nothing either, in this same transaction. An idle
                # polling worker asks for every free slot each time it looks.
                if not tx.pipelined and await later() is None:
                    break
            return sent

        laters = await self.db.run_transaction(claims)
        rows = [row for later in laters if (row := await later()) is not None]
        for row in rows:
            self.log_claim(row, worker_id, started)
        return rows

    def claim_with(
        self, worker_id: str, workflows: list[str], ttl: float, limits: dict[str, int]
    ) -> Callable[[Tx], Awaitable[Later]]:
        """`claim_next` as the end of another write transaction (an admission's, for a worker
        in the submitting process): the same statements, committed with what precedes them and
        sent with them (nothing is read before the commit: on PostgreSQL the admission and the
        claim are one message). The claim's row is read once the transaction has committed;
        log it then with `log_claim`."""
        params = self._claim_params(worker_id, workflows, ttl, limits)

        async def claim(tx: Tx) -> Later:
            if limits:
                await tx.execute("claim_lock")
            return await tx.send("claim_next", params)

        return claim

    @staticmethod
    def _claim_params(
        worker_id: str, workflows: list[str], ttl: float, limits: dict[str, int]
    ) -> dict[str, Any]:
        return {
            "worker_id": worker_id,
            "workflows": json.dumps(workflows),
            "ttl": ttl,
            "limits": json.dumps(limits),
        }

    @staticmethod
    def log_claim(row: Row | None, worker_id: str, started: float) -> None:
        """The committed claim's line (none if nothing was claimed); `started`: monotonic."""
        if row is not None:
            takeover = row["previous_status"] == "running"
            data = {"from": row["previous_status"], "to": "running"}
            if takeover:
                data["previous_owner"] = row["previous_owner"]
            data["expires_at"] = row["lease_expires_at"]
            # The claim is logged before the executor binds the run's ids: give them to its line.
            ids = {
                "job_id": row["job_id"],
                "workflow": f"{row['workflow']}@{row['workflow_version']}",
            }
            kind = "lease.takeover" if takeover else "lease.claimed"
            logs.event(
                row["run_id"],
                kind,
                data,
                worker_id=worker_id,
                token=row["lease_token"],
                ids=ids,
                took=time.monotonic() - started,
            )

    @staticmethod
    async def renew_lease(tx: Tx, run_id: str, token: int, ttl: float) -> bool:
        """Extend a lease to `ttl` seconds from the database's now; False if `token` no longer
        holds the run."""
        row = await tx.one("renew_lease", {"run_id": run_id, "lease_token": token, "ttl": ttl})
        return row is not None

    @staticmethod
    async def end_lease(tx: Tx, run_id: str, token: int) -> bool:
        """Make a lease expire now (by the database's clock); False if `token` no longer holds
        the run."""
        row = await tx.one("end_lease", {"run_id": run_id, "lease_token": token})
        return row is not None

    @staticmethod
    async def set_heartbeat_details(tx: Tx, run_id: str, token: int, details_json: str) -> None:
        await tx.execute(
            "set_heartbeat_details",
            {"run_id": run_id, "lease_token": token, "details": details_json},
        )

    # -- workers --------------------------------------------------------------------------------

    async def upsert_worker(
        self,
        worker_id: str,
        *,
        host: str,
        pid: int,
        concurrency: int,
        workflows: list[str],
        refused: dict[str, str] | None = None,
    ) -> None:
        """Say the worker is alive, what it serves and what it refuses (key -> why), in one
        statement (its own transaction)."""
        params = {
            "worker_id": worker_id,
            "host": host,
            "pid": pid,
            "concurrency": concurrency,
            "workflows": json.dumps(sorted(workflows)),
            "refused": json.dumps(refused or {}, sort_keys=True),
        }
        await self.db.single("upsert_worker", params)

    async def hold_graph_shape(
        self, workflow: str, version: str, digest: str, shape: str, worker_id: str
    ) -> Row:
        """The structure `workflow@version` was first served with (`digest`, `shape`): this one,
        if it is the first."""
        key = {"workflow": workflow, "version": version}
        async with self.db.transaction() as tx:
            await tx.execute(
                "record_graph_shape",
                {**key, "digest": digest, "shape": shape, "worker_id": worker_id},
            )
            row = await tx.one("get_graph_shape", key)
        assert row is not None
        return row

    async def graph_shape(self, workflow: str, version: str) -> Row | None:
        """The structure `workflow@version` is held to (None: never served yet)."""
        async with self.db.read() as tx:
            return await tx.one("get_graph_shape", {"workflow": workflow, "version": version})

    async def accept_graph_shape(
        self, workflow: str, version: str, digest: str, shape: str, by: str
    ) -> None:
        """Hold `workflow@version` to this structure from now on (an operator's word)."""
        params = {"workflow": workflow, "version": version, "digest": digest, "shape": shape}
        await self.db.single("accept_graph_shape", {**params, "by": by})

    async def stop_worker(self, worker_id: str) -> None:
        await self.db.single("stop_worker", {"worker_id": worker_id})

    async def next_due(self, workflows: list[str], *, outbox: bool) -> Due:
        """What an idle worker of `workflows` has to do and when (one read); outbox
        deliveries count only for a worker that delivers them (`outbox`)."""
        params = {"workflows": json.dumps(sorted(workflows)), "outbox": int(outbox)}
        async with self.db.read() as tx:
            row = await tx.one("next_due", params)
        assert row is not None
        now = float(row["now"])

        def after(at: Any) -> float | None:
            return None if at is None else max(0.0, float(at) - now)

        return Due(bool(row["queued"]), after(row["lease_at"]), after(row["sweep_at"]))

    async def workers(self, window: float) -> list[Row]:
        """Workers that heartbeated within the last `window` seconds (database clock)."""
        async with self.db.read() as tx:
            return await tx.all("list_workers", {"window": window})

    async def served_workflows(self, window: float) -> list[Row]:
        """What each worker serves (`workflows`, JSON keys) and whether it is `live` (heartbeat
        within `window`), most recently seen first."""
        async with self.db.read() as tx:
            return await tx.all("served_workflows", {"window": window})


def _held_by(row: Row | None, run_id: str, token: int) -> Row:
    """The run's lease row, if `token` is its current token; else RunNotFound or LeaseLost."""
    if row is None:
        raise RunNotFound(f"no run {run_id!r}")
    if int(row["lease_token"]) != token:
        raise LeaseLost(
            f"run {run_id}: lease token {token} is stale (current {row['lease_token']}, "
            f"owner {row['lease_owner']})"
        )
    return row
