"""Small real parts shared by the review tests: a recording provider and worker helpers.

The provider stands in for the outside world: it counts what it received, so a test checks
what the world saw rather than what Keel believes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any

import keel
from keel.core import leases
from keel.core.store.store import Lease
from keel.runtime.worker import Worker, WorkerStats


@dataclass
class Provider:
    """Records every delivery under its idempotency key (does not dedupe unless told to)."""

    dedupe: bool = False
    deliveries: list[str] = field(default_factory=list)
    payloads: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def deliver(self, key: str, payload: Any) -> dict[str, Any]:
        with self.lock:
            self.deliveries.append(key)
            self.payloads.append(payload)
            return {"id": f"p-{len(self.deliveries)}", "payload": payload}


def drain(app: keel.App, concurrency: int = 4, within: float = 20.0) -> WorkerStats:
    """Run a worker until nothing is queued or running; fail (not hang) past `within`."""
    worker = Worker(app.aio, concurrency=concurrency, stop_when_idle=True)
    loop = app.aio.portal.loop
    future = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        return future.result(timeout=within)
    except concurrent.futures.TimeoutError:
        for _ in range(2):
            loop.call_soon_threadsafe(worker.stop)
        future.result(timeout=10)
        raise AssertionError(
            f"worker did not drain within {within}s; running: {app.list_runs(status='running')}"
        ) from None


def claim(app: keel.App, worker_id: str) -> tuple[Lease, dict[str, Any]]:
    async def go() -> tuple[Lease, dict[str, Any]]:
        rt = app.aio
        await rt.open()
        got = await leases.claim(
            rt.store, worker_id, rt.workflows.keys(), rt.clock.now(), rt.lease_ttl
        )
        assert got is not None, "nothing to claim"
        return got

    return app.aio.portal.call(go())


def execute(app: keel.App, lease: Lease, row: dict[str, Any]) -> str:
    return app.aio.portal.call(app.aio.executor(lease.worker_id).execute(lease, row))


def kinds(app: keel.App, run_id: str) -> list[str]:
    return [e["kind"] for e in app.get_run(run_id).timeline]
