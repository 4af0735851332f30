"""Fenced leases: claim (with a new token at every takeover), renew, release.

A claim is one statement: pick the oldest claimable run (PostgreSQL: FOR UPDATE SKIP LOCKED,
so concurrent workers never pick the same row), bump its token, set the expiry and write the
claim's timeline event; the moves it makes (queued or running to running) are in the transition
table. Claiming
also reaps: a `running` run whose lease expired is claimable, so a dead worker's runs are
picked up by whoever claims next.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from enum import StrEnum

from keel.core.codec import loads
from keel.core.errors import LeaseLost
from keel.core.faults import fault_point
from keel.core.lifecycle import Status
from keel.core.runs import give_up, transition
from keel.core.store.base import Later, Row, Tx
from keel.core.store.store import Lease, Store

log = logging.getLogger("keel.core.leases")


class LeaseEnd(StrEnum):
    """How an execution ends when the run goes on elsewhere, in no status of its own."""

    LOST = "lease_lost"
    """Another worker took the run over: this execution was fenced out."""
    RELEASED = "released"
    """The worker is stopping and gave the run back to the queue."""
    RETRY = "retry"
    """An infrastructure fault or a crash outside the graph interrupted this execution; the run
    resumes from its last checkpoint (at once, after a backoff, or when the lease expires)."""


async def claim(
    store: Store,
    worker_id: str,
    workflows: Iterable[str],
    ttl: float,
    limits: Mapping[str, int] | None = None,
    max_crashes: int | None = None,
) -> tuple[Lease, Row] | None:
    """Take the oldest claimable run; `limits` caps running runs per workflow key, cluster-wide.

    One statement (`Store.claim_next`): the claim, its new token and its timeline event commit
    together. A takeover counts one crashed attempt: the execution before it ended without
    giving the run back (its process died, or it crashed and held the lease for a backoff). A
    run taken over for the `max_crashes`-th time is not executed again: it ends failed here,
    fenced by the token just taken, and the next candidate is tried."""
    keys = sorted(workflows)
    wanted = _claimable(keys, limits)
    while True:
        row = await store.claim_next(worker_id, keys, ttl, wanted)
        if row is None:
            return None
        got = await accept(store, worker_id, row, max_crashes)
        if got is not None:
            return got


async def claim_batch(
    store: Store,
    worker_id: str,
    workflows: Iterable[str],
    ttl: float,
    count: int,
    limits: Mapping[str, int] | None = None,
    max_crashes: int | None = None,
) -> tuple[list[tuple[Lease, Row]], bool]:
    """Up to `count` of the oldest claimable runs in one transaction (`Store.claim_batch`), each
    accepted as `claim` accepts one. Also whether all `count` were claimed: if so, more may be
    waiting (a backlog)."""
    keys = sorted(workflows)
    rows = await store.claim_batch(worker_id, keys, ttl, _claimable(keys, limits), count)
    got = [a for row in rows if (a := await accept(store, worker_id, row, max_crashes))]
    return got, len(rows) >= count


def claim_with(
    store: Store,
    worker_id: str,
    workflows: Iterable[str],
    ttl: float,
    limits: Mapping[str, int] | None = None,
) -> Callable[[Tx], Awaitable[Later]]:
    """`claim`'s statement as the end of another write transaction (a worker of the process
    that admits a run takes it in the admission's commit); its row, once committed, goes to
    `Store.log_claim` and `accept`."""
    keys = sorted(workflows)
    return store.claim_with(worker_id, keys, ttl, _claimable(keys, limits))


def _claimable(keys: list[str], limits: Mapping[str, int] | None) -> dict[str, int]:
    # The claim's moves (queued>running, running>running) are its query's `-- moves:` header,
    # held against the lifecycle table by tests/unit/test_state_machine.py.
    return {k: int(n) for k, n in (limits or {}).items() if k in keys}


async def accept(
    store: Store, worker_id: str, row: Row, max_crashes: int | None
) -> tuple[Lease, Row] | None:
    """The lease a committed claim took; None for a takeover past `max_crashes`, which ends
    the run failed instead (fenced by the token just taken)."""
    crashes = int(row["crash_count"])
    lease = Lease(row["run_id"], worker_id, int(row["lease_token"]))
    takeover = row["previous_status"] == Status.RUNNING
    if not takeover or max_crashes is None or crashes < max_crashes:
        return lease, row
    try:
        async with store.fenced(lease.run_id, lease.token) as tx:
            await _give_up(store, tx, row, worker_id, crashes, max_crashes)
    except LeaseLost:
        pass  # another worker took it over meanwhile: it gives up on it
    return None


async def _give_up(
    store: Store, tx: Tx, row: Row, worker_id: str, crashes: int, limit: int
) -> None:
    """End a run whose executions keep dying (a node that kills its process: OOM, a segfault,
    os._exit) failed, instead of handing it to the next worker to kill. If the lease that just
    lapsed lapsed while its worker's event loop was blocked (an async node calling blocking
    code: the worker was alive, its heartbeat could not run), the error says so instead."""
    token = int(row["lease_token"])
    blocked = blocked_loop(await store.loop_blocks(tx, row["run_id"]), lapsed=token - 1)
    if blocked is None:
        cause = "worker died"
        error = (
            f"the run's worker died {crashes} times while running it (its process exited or "
            f"was killed: out of memory, a signal, a crash in native code); the limit is {limit}"
        )
    else:
        cause = "blocked loop"
        error = f"{blocked.describe(crashes)}; the limit is {limit}. {BLOCKING_ADVICE}"
    data = {"cause": cause, "attempt": crashes, "limit": limit, "error": error}
    await give_up(store, tx, row, data, error=error, worker_id=worker_id, token=token)


NOT_BLOCKING = (
    "use `await asyncio.sleep`, `asyncio.to_thread`, or a plain `def` node (run in a thread)"
)
"""What to do instead of blocking code in an async node (the worker's warnings say it too)."""
BLOCKING_ADVICE = f"An async node must not call blocking code: {NOT_BLOCKING}"


@dataclass(frozen=True)
class BlockedLoop:
    """What a run's timeline says of the blocked event loop its last lease lapsed in."""

    node: str | None
    """The node that blocked the loop (None: not known, or not inside a node)."""
    by_run: str | None
    """The run of that node, if another run of the same worker (this run was a bystander)."""
    lasted: float
    """Seconds from the block's start until the run was given up on (past the lease's lapse)."""
    lease_ttl: float | None
    times: int
    """How many of the run's lapsed leases lapsed in a blocked loop."""

    def describe(self, crashes: int) -> str:
        lease = f", longer than its {self.lease_ttl:g} s lease" if self.lease_ttl else ""
        node = f"node {self.node!r}" if self.node else "code outside any node"
        if self.by_run:
            what = f"the run's worker's event loop was blocked by {node} of run {self.by_run}"
        else:
            what = f"the run's {node} blocked its worker's event loop"
        return (
            f"{what} for {self.lasted:.1f} s and more{lease}: the heartbeat could not renew "
            f"the lease, and another worker took the run over (not a dead worker); "
            f"{self.times} of its {crashes} takeovers followed a blocked loop"
        )


def blocked_loop(rows: list[Row], lapsed: int) -> BlockedLoop | None:
    """The block that lease token `lapsed` lapsed in, from `Store.loop_blocks` rows (newest
    first); None unless that token's worker recorded a block that had not ended while it still
    held the run (the watchdog records `loop.unblocked` when a block ends in time)."""
    ended = {int(r["lease_token"]) for r in rows if r["kind"] == "loop.unblocked"}
    blocks: dict[int, Row] = {}
    for r in rows:
        token = int(r["lease_token"])
        if r["kind"] == "loop.blocked" and token not in ended:
            blocks.setdefault(token, r)  # the newest of that token's blocks
    last = blocks.get(lapsed)
    if last is None:
        return None
    data = loads(last["data"]) or {}
    # The watchdog wrote the event `blocked_for` seconds into the block (by its own clock): the
    # block began that long before the event's time (the database's). It had not ended when the
    # lease lapsed (no `loop.unblocked`), and nothing of that worker has been heard since: as far
    # as the database knows, it lasts until now, this claim.
    started = float(last["at"]) - float(data.get("blocked_for") or 0.0)
    ttl = data.get("lease_ttl")
    return BlockedLoop(
        node=data.get("node"),
        by_run=data.get("by_run"),
        lasted=max(float(last["now"]) - started, 0.0),
        lease_ttl=float(ttl) if ttl else None,
        times=len(blocks),
    )


async def renew(store: Store, leases: Iterable[Lease], ttl: float) -> list[Lease]:
    """Extend the given leases; return those this worker no longer holds."""
    lost: list[Lease] = []
    leases = list(leases)
    fault_point("lease.renew")
    if not leases:
        return lost  # an idle worker's heartbeat costs no transaction
    async with store.transaction() as tx:
        for lease in leases:
            if not await store.renew_lease(tx, lease.run_id, lease.token, ttl):
                lost.append(lease)
    return lost


@asynccontextmanager
async def claim_kept(
    what: str,
    renew_claim: Callable[[], Awaitable[bool]],
    ttl: float,
    is_infrastructure: Callable[[BaseException], bool],
) -> AsyncIterator[None]:
    """Renew a claim (`renew_claim()`: fenced by the claim, False once it is not held) every
    third of its `ttl` for as long as the body (a provider call) runs, so a slow provider is
    not taken for a dead caller. A frozen or killed caller stops renewing and its claim lapses."""

    async def renew() -> None:
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                held = await renew_claim()
            except Exception as exc:
                # Never the call's failure, nor the end of renewing: only the database saying
                # the claim is gone is. Given up on an error (a timeout not counted as the
                # database's), the claim lapsed under a live call, which another caller then
                # took for a dead one's, and made again.
                if is_infrastructure(exc):
                    log.warning("%s: claim not renewed: %s", what, exc)
                else:
                    log.exception("%s: claim renewal failed", what)
                continue
            if not held:
                # Someone else took it over: this call's outcome will not be recorded.
                log.warning("%s: claim lapsed during the call", what)
                return

    renewing = asyncio.create_task(renew(), name=f"keel-claim-{what}")
    try:
        yield
    finally:
        renewing.cancel()
        with suppress(asyncio.CancelledError):
            await renewing


async def end_dead(store: Store, run_id: str, token: int) -> bool:
    """The holder of `token` is dead (its process was seen to exit): expire its lease now (by the
    database's clock), so the next claim takes the run over (a `lease.takeover`, a new token)
    instead of waiting out the TTL. Only for callers that know the process is gone: a live holder
    would be fenced out. False if `token` no longer holds the run."""
    async with store.transaction() as tx:
        ended = await store.end_lease(tx, run_id, token)
        if ended:
            await store.notify_wake(tx, run_id)  # quiet workers take it over now, not at a poll
        return ended


async def release(store: Store, lease: Lease, reason: str) -> None:
    """Give a running run back to the queue (graceful shutdown) so another worker resumes it."""
    async with store.fenced(lease.run_id, lease.token) as tx:
        run = await store.read_run(tx, lease.run_id)
        assert run is not None
        if run["status"] != Status.RUNNING:
            return
        await transition(
            store,
            tx,
            run,
            Status.QUEUED,
            worker_id=lease.worker_id,
            token=lease.token,
            event={"reason": reason},
        )
        await store.notify_wake(tx, lease.run_id)  # another worker resumes it at once
