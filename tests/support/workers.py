"""What a worker does, one move at a time, in this process: the tests drive the real parts.

`drain` runs a real Worker until nothing is left to do; `claim` and `execute` split a worker's
work in two so a test can act between them; `steal_lease` is a second worker taking over a
stalled run; `sweep` applies due deadlines as every worker's sweeper does; `answer_lost_once`
drops the connection right after a transaction committed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

import keel
from keel.core import leases
from keel.core.store.base import Tx
from keel.core.store.store import Lease
from keel.runtime.worker import Worker, WorkerStats


def drain(
    app: keel.App, concurrency: int = 4, within: float = 30.0, worker: Worker | None = None
) -> WorkerStats:
    """Run a worker until nothing is queued or running; fail (not hang) if that takes too long.

    A run left `running` under a live lease would keep a stop-when-idle worker polling until
    the lease expires, which never happens on a ManualClock: that is a bug, reported as one.
    """
    worker = worker or Worker(app.aio.runtime, concurrency=concurrency, stop_when_idle=True)
    loop = app.aio.runtime.portal.loop
    future = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        return future.result(timeout=within)
    except concurrent.futures.TimeoutError:
        for _ in range(2):  # drain, then stop now
            loop.call_soon_threadsafe(worker.stop)
        future.result(timeout=10)
        stuck = app.list_runs(status="running")
        raise AssertionError(f"worker did not drain within {within}s; running: {stuck}") from None


def claim(app: keel.App, worker_id: str) -> tuple[Lease, dict[str, Any]]:
    """Claim the oldest claimable run as `worker_id`, as a worker's loop does."""

    async def go() -> tuple[Lease, dict[str, Any]]:
        rt = app.aio.runtime
        await rt.open()
        got = await leases.claim(rt.store, worker_id, rt.workflows.keys(), rt.lease_ttl)
        assert got is not None, "nothing to claim"
        return got

    return app.aio.runtime.portal.call(go())


def execute(app: keel.App, lease: Lease, row: dict[str, Any]) -> str:
    """Execute a claimed run once with the worker's executor; return how it ended."""
    return app.aio.runtime.portal.call(
        app.aio.runtime.executor(lease.worker_id).execute(lease, row)
    )


def execute_once(app: keel.App, worker_id: str) -> str:
    """Claim the oldest claimable run as `worker_id` and execute it once, as a worker does."""
    return execute(app, *claim(app, worker_id))


async def steal_lease(app: keel.App, clock: keel.ManualClock) -> None:
    """What a second worker does when the first stalls past its lease: take the run over."""
    rt = app.aio.runtime
    clock.advance(rt.lease_ttl + 1)
    # PostgreSQL claims skip a row locked by a checkpoint write still in flight (FOR UPDATE
    # SKIP LOCKED against the write's FOR SHARE fence): poll, as a real worker would.
    for _ in range(500):
        got = await leases.claim(rt.store, "thief", rt.workflows.keys(), rt.lease_ttl)
        if got is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nothing to take over")


def sweep(app: keel.App) -> int:
    """One pass of the deadline sweeper; return how many reminders and policies it applied."""

    async def go() -> int:
        await app.aio.open()
        return await app.aio.runtime.sweep()

    return app.aio.runtime.portal.call(go())


@contextmanager
def answer_lost_once(app: keel.App, run_id: str, status: str) -> Iterator[list[int]]:
    """The first step transaction after which `run_id` is `status` commits, then its answer
    is lost: the driver's error for a dropped connection is raised instead (once; the list
    says whether it was)."""
    store = app.aio.runtime.store
    real = store.step_transaction
    lost: list[int] = []

    async def commits_then_loses_the_answer(body: Callable[[Tx], Any]) -> Any:
        result = await real(body)
        if not lost and (await app.aio.get_run(run_id)).status == status:
            lost.append(1)
            if store.dialect == "sqlite":
                raise sqlite3.OperationalError("disk I/O error")
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    store.step_transaction = commits_then_loses_the_answer  # type: ignore[method-assign]
    try:
        yield lost
    finally:
        del store.step_transaction
