"""A worker's upkeep: what keeps it alive and known while its claim loop runs.

The heartbeat renews the leases of held runs every `heartbeat_interval` and cancels a run
whose lease was taken over; the worker's row (its workflows, concurrency, refusals) is
announced with it and marked stopped at the end.

The database's clock judges every lease and deadline; the worker still compares its own clock
with it at start (refusing to start past `max_clock_skew`) and every minute (warning), since a
host that far off logs and signs with a wrong time.

A database that goes away (restart, failover, full disk, pool timeout) does not stop the
worker: the claim loop backs off (exponential, jittered, capped) and reconnects.

Sweeps apply due deadline policies and deliver notifications; stranded runs (of a version no
live worker executes) are logged once each.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
from typing import Any

from keel.core import infra, leases, logs, notification_outbox, retention
from keel.core.clock import judge_skew
from keel.core.deadlines import sweep_deadlines
from keel.core.errors import ClockSkew
from keel.core.store.store import Lease
from keel.core.workflows import Workflows
from keel.langgraph.executor import Outcome
from keel.runtime.ports import WorkerHost
from keel.runtime.stranded import live_window, report_stranded
from keel.runtime.watchdog import BlockRecorder, LoopWatchdog

log = logging.getLogger("keel.runtime.worker")

PYTHON_GEN0 = 700
"""CPython's own threshold for a collection of its youngest generation (3.11-3.12)."""
WORKER_GEN0 = 10_000
"""The youngest generation's threshold in a worker process (`keel worker`)."""


def collect_less_often() -> bool:
    """Raise the youngest generation's collection threshold from 700 to `WORKER_GEN0`, unless
    the process chose its own (an app module may, as it loads); whether it did.

    For a process that runs a worker and nothing else. Every step allocates thousands of short-
    lived containers (LangGraph's tasks and checkpoints, Keel's statements), so at 700 the
    collector ran about 700 times per 1,000 runs drained, 0.5 ms a run: 7% of a PostgreSQL
    worker's time. At 10,000 it ran 31 times, 0.15 ms a run. A cycle of garbage lives a little
    longer; nothing that is not garbage is touched."""
    gen0, gen1, gen2 = gc.get_threshold()
    if gen0 != PYTHON_GEN0:
        return False
    gc.set_threshold(WORKER_GEN0, gen1, gen2)
    return True


STRANDED_CHECK_INTERVAL = 10.0
"""Seconds between looks for stranded runs (each new one is logged once)."""
QUIET_STRANDED_CHECK_INTERVAL = 60.0
"""The same for a quiet worker (PostgreSQL), whose looks cost round trips an idle worker
should not make."""


class WorkerUpkeep:
    """Heartbeat, clock checks, outage backoff, sweeps, stranded runs, the loop watchdog and
    the worker's row: mixed into `keel.runtime.worker.Worker`, which sets every attribute
    below."""

    runtime: WorkerHost
    worker_id: str
    concurrency: int
    serving: Workflows
    refused: dict[str, str]
    max_clock_skew: float
    clock_check_interval: float
    clock_skew: float | None
    loop_block_threshold: float
    watchdog: LoopWatchdog | None
    prune_older_than: float | None
    prune_interval: float
    database_unavailable_since: float | None
    _skew_warned: bool
    _stranded_logged: set[str]
    _next_stranded_check: float
    _outage_attempts: int
    _tasks: dict[str, tuple[Lease, asyncio.Task[Outcome]]]
    _stopping: asyncio.Event

    # Reconnect attempts while the database is away: quick at first, then every few seconds.
    reconnect_backoff = 0.1
    max_reconnect_backoff = 5.0

    def _watch_loop(self) -> None:
        """Start the loop-lag watchdog (keel.runtime.watchdog): a blocked loop is logged, with
        the node blocking it, and recorded on the timelines of the runs held meanwhile, so that
        a run whose leases lapsed that way fails saying so rather than "the worker died"."""
        if self.loop_block_threshold <= 0:
            return
        rt = self.runtime
        record = None
        if rt.connector.shared:  # not SQLite's :memory:, which another connection cannot see
            record = BlockRecorder(
                rt.connector.url, self.worker_id, rt.services.lease_ttl, rt.connector.clock_override
            )
        tasks = self._tasks
        self.watchdog = LoopWatchdog(
            threshold=self.loop_block_threshold,
            # Read from the watchdog's thread while the loop is blocked: one C-level copy.
            held=lambda: [lease for lease, _ in list(tasks.values())],
            record=record,
            lease_ttl=rt.services.lease_ttl,
            worker_id=self.worker_id,
        )
        self.watchdog.start()

    async def _guarded(self, step: Any) -> None:
        try:
            await step
        except Exception as exc:
            if not self.runtime.services.store.is_infrastructure(exc):
                raise
            log.warning("worker %s: database unavailable (%r); continuing", self.worker_id, exc)

    def _reachable(self) -> None:
        if self.database_unavailable_since is not None:
            away = asyncio.get_running_loop().time() - self.database_unavailable_since
            log.warning("worker %s: database reachable again after %.1f s", self.worker_id, away)
        self.database_unavailable_since = None
        self._outage_attempts = 0

    async def _wait_for_database(self, exc: Exception) -> None:
        """Back off before the next claim: the database (or its pool) failed, not Keel."""
        self._outage_attempts += 1
        if self.database_unavailable_since is None:
            self.database_unavailable_since = asyncio.get_running_loop().time()
        delay = infra.backoff(
            self._outage_attempts, base=self.reconnect_backoff, cap=self.max_reconnect_backoff
        )
        log.warning(
            "worker %s: waiting for the database (attempt %d, next in %.2f s): %r",
            self.worker_id,
            self._outage_attempts,
            delay,
            exc,
            extra=logs.database_error(exc),
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)

    async def _check_clock(self) -> None:
        """Measure this clock against the database's; warn past a third of the lease TTL (once
        until it is back in range), raise ClockSkew past `max_clock_skew`."""
        rt = self.runtime
        before = rt.services.clock.now()
        db_now = await rt.services.store.database_now()
        skew = (before + rt.services.clock.now()) / 2 - db_now
        self.clock_skew = skew
        warning = judge_skew(skew, lease_ttl=rt.services.lease_ttl, limit=self.max_clock_skew)
        if warning and not self._skew_warned:
            log.warning(
                "worker %s: %s; leases and deadlines follow the database's clock, but fix "
                "this host's time sync",
                self.worker_id,
                warning,
            )
        self._skew_warned = warning is not None

    async def _heartbeat(self) -> None:
        rt = self.runtime
        loop = asyncio.get_running_loop()
        next_clock_check = loop.time() + self.clock_check_interval
        while True:
            await asyncio.sleep(rt.heartbeat_interval)
            if loop.time() >= next_clock_check:
                next_clock_check = loop.time() + self.clock_check_interval
                try:
                    await self._check_clock()
                except ClockSkew as exc:  # running runs are safe: only say it, loudly
                    log.error("worker %s: %s", self.worker_id, exc)
                except Exception:
                    log.exception("clock check failed; the next one retries")
            held = [lease for lease, _ in self._tasks.values()]
            try:
                lost = await leases.renew(rt.services.store, held, rt.services.lease_ttl)
                await self._announce()
            except Exception as exc:
                # Kept at its interval, not backed off: each renewal missed brings the TTL closer.
                failed = {"event": "heartbeat.failed"}
                if rt.services.store.is_infrastructure(exc):
                    log.warning(
                        "heartbeat: database unavailable (%r); leases may expire",
                        exc,
                        extra={**failed, **logs.database_error(exc)},
                    )
                else:
                    log.exception("heartbeat failed; leases may expire", extra=failed)
                continue
            for lease in lost:
                entry = self._tasks.get(lease.run_id)
                if entry is not None and entry[0].token == lease.token:
                    log.warning(
                        "worker %s run %s: lease %s was taken over; stopping",
                        self.worker_id,
                        lease.run_id,
                        lease.token,
                        extra={"event": "lease.lost", "run_id": lease.run_id},
                    )
                    entry[1].cancel()

    async def _prune(self) -> None:
        assert self.prune_older_than is not None
        while True:
            try:
                await retention.prune(self.runtime.services, older_than=self.prune_older_than)
            except Exception:
                log.exception("scheduled prune failed; the next one retries")
            await asyncio.sleep(self.prune_interval)

    async def _announce(self) -> None:
        await self.runtime.services.store.upsert_worker(
            self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            concurrency=self.concurrency,
            workflows=self.serving.keys(),
            refused=self.refused,
        )

    async def _goodbye(self) -> None:
        store = self.runtime.services.store
        try:
            await store.stop_worker(self.worker_id)
        except Exception as exc:
            log.warning("could not record worker stop: %r", exc)

    async def _sweep(self) -> None:
        try:
            services = self.runtime.services
            applied = await sweep_deadlines(services)
            if services.notifiers:
                stopping = self._stopping
                await notification_outbox.dispatch(services, self.worker_id, stopping=stopping)
        except Exception as exc:
            if self.runtime.services.store.is_infrastructure(exc):
                # The claim that follows meets the same fault and backs the whole loop off.
                log.warning("sweep: database unavailable (%r); the next pass retries", exc)
            else:
                log.exception("sweep failed; the next pass retries")
            return
        if applied:
            log.info("applied %d deadline policies", applied)
        loop = asyncio.get_running_loop()
        if loop.time() >= self._next_stranded_check:
            self._next_stranded_check = loop.time() + STRANDED_CHECK_INTERVAL
            await self._report_stranded()

    async def _report_stranded(self) -> None:
        rt = self.runtime
        window = live_window(rt.heartbeat_interval)
        await report_stranded(rt.services.store, window, self.serving.keys(), self._stranded_logged)
