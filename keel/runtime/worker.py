"""The worker: claim runs up to its concurrency, execute them, keep their leases alive.

Runs are asyncio tasks (sync nodes run in threads). A heartbeat renews the leases of held runs
every `heartbeat_interval`; a run whose lease was taken over is cancelled here and fenced out
in the database. Stopping: no new claims, running runs get `grace` seconds, then are cancelled
and their leases given back so another worker resumes them at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from keel.core import leases
from keel.core.leases import LeaseEnd
from keel.core.lifecycle import FINISHED
from keel.core.store.store import Lease
from keel.langgraph.executor import Executor, Outcome
from keel.runtime.runtime import Runtime

log = logging.getLogger("keel.runtime.worker")


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerStats:
    """What a worker did with the runs it claimed: each ended its execution in one of these."""

    claimed: int = 0
    finished: int = 0
    """Completed, failed or cancelled."""
    waiting: int = 0
    """Paused on a wait (an approval, an in-doubt effect), or queued again by a decision."""
    lost: int = 0
    """Given back (drained at a step boundary) or taken over by another worker."""

    def __str__(self) -> str:
        return (
            f"claimed {self.claimed}: finished {self.finished}, waiting {self.waiting}, "
            f"given back {self.lost}"
        )


class Worker:
    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int = 4,
        worker_id: str | None = None,
        poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
        stop_when_idle: bool = False,
        grace: float = 30.0,
        sweep_interval: float = 1.0,
        sweep_before_exit: bool = True,
    ) -> None:
        self.runtime = runtime
        self.sweep_interval = sweep_interval
        self.sweep_before_exit = sweep_before_exit
        self.concurrency = max(1, concurrency)
        self.worker_id = worker_id or new_worker_id()
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.stop_when_idle = stop_when_idle
        self.grace = grace
        self.stats = WorkerStats()
        self._tasks: dict[str, tuple[Lease, asyncio.Task[Outcome]]] = {}
        self._stopping = asyncio.Event()
        self._stop_requests = 0

    def stop(self) -> None:
        """First call: drain (runs stop at their next step boundary). Second call: stop now."""
        self._stop_requests += 1
        self._stopping.set()
        self.runtime.set_draining(True)
        if self._stop_requests > 1:
            for _, task in self._tasks.values():
                task.cancel()

    async def run(self) -> WorkerStats:
        rt = self.runtime
        await rt.open()
        rt.set_draining(False)  # an earlier worker's stop on this runtime is over
        executor = rt.executor(self.worker_id)
        wake = rt.waker()
        heartbeat = asyncio.create_task(self._heartbeat())
        listener = asyncio.create_task(rt.connector.listen("keel_wake", wake.set))
        await self._announce()
        delay = self.poll_interval
        next_sweep = 0.0
        loop = asyncio.get_running_loop()
        try:
            while not self._stopping.is_set():
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.sweep_interval
                    await self._sweep()
                claimed = await self._fill(executor)
                if (
                    self.stop_when_idle
                    and not claimed
                    and not self._tasks
                    and await rt.store.count_unfinished(rt.workflows.keys()) == 0
                ):
                    # Deliver what the last runs announced (a wait's request) before leaving,
                    # and stay if a due deadline queued a run meanwhile.
                    if not self.sweep_before_exit:
                        break
                    await self._sweep()
                    if await rt.store.count_unfinished(rt.workflows.keys()) == 0:
                        break
                delay = self.poll_interval if claimed else min(delay * 2, self.max_poll_interval)
                wake.clear()
                waiters: list[asyncio.Future[Any]] = [
                    asyncio.ensure_future(wake.wait()),
                    asyncio.ensure_future(self._stopping.wait()),
                ]
                waiters += [task for _, task in self._tasks.values()]
                done, _ = await asyncio.wait(
                    waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED
                )
                for w in waiters[:2]:
                    w.cancel()
                if done & {t for _, t in self._tasks.values()}:
                    delay = self.poll_interval
        finally:
            await self._drain()
            heartbeat.cancel()
            listener.cancel()
            await asyncio.gather(heartbeat, listener, return_exceptions=True)
            await self._goodbye()
        return self.stats

    async def _fill(self, executor: Executor) -> int:
        rt = self.runtime
        claimed = 0
        while len(self._tasks) < self.concurrency and not self._stopping.is_set():
            got = await leases.claim(
                rt.store,
                self.worker_id,
                rt.workflows.keys(),
                rt.clock.now(),
                rt.lease_ttl,
                rt.workflows.limits(),
            )
            if got is None:
                break
            lease, row = got
            claimed += 1
            self.stats.claimed += 1
            log.info(
                "worker %s claimed run %s (token %s)", self.worker_id, lease.run_id, lease.token
            )
            task = asyncio.create_task(
                executor.execute(lease, row), name=f"keel-run-{lease.run_id}"
            )
            self._tasks[lease.run_id] = (lease, task)
            task.add_done_callback(functools.partial(self._done, lease.run_id))
        return claimed

    def _done(self, run_id: str, task: asyncio.Task[Outcome]) -> None:
        # A stale execution ending must not forget a newer one of the same run (a re-claim).
        if (entry := self._tasks.get(run_id)) is not None and entry[1] is task:
            del self._tasks[run_id]
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error(
                "worker %s run %s: executor crashed: %r", self.worker_id, run_id, task.exception()
            )
            return
        outcome = task.result()
        if outcome in (LeaseEnd.LOST, LeaseEnd.RELEASED):
            self.stats.lost += 1
        elif outcome in FINISHED:
            self.stats.finished += 1
        else:
            self.stats.waiting += 1

    async def _sweep(self) -> None:
        try:
            applied = await self.runtime.sweep()
            if self.runtime.notifiers:
                await self.runtime.dispatch(self.worker_id)
        except Exception:
            log.exception("sweep failed; the next pass retries")
            return
        if applied:
            log.info("applied %d deadline policies", applied)

    async def _heartbeat(self) -> None:
        rt = self.runtime
        while True:
            await asyncio.sleep(rt.heartbeat_interval)
            held = [lease for lease, _ in self._tasks.values()]
            try:
                lost = await leases.renew(rt.store, held, rt.clock.now(), rt.lease_ttl)
                await self._announce()
            except Exception:
                log.exception("heartbeat failed; leases may expire")
                continue
            for lease in lost:
                entry = self._tasks.get(lease.run_id)
                if entry is not None and entry[0].token == lease.token:
                    log.warning(
                        "worker %s run %s: lease %s was taken over; stopping",
                        self.worker_id,
                        lease.run_id,
                        lease.token,
                    )
                    entry[1].cancel()

    async def _drain(self) -> None:
        if not self._tasks:
            return
        tasks = [task for _, task in self._tasks.values()]
        held = [lease for lease, _ in self._tasks.values()]
        if self._stop_requests < 2:
            await asyncio.wait(tasks, timeout=self.grace)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        rt = self.runtime
        for lease in held:
            try:
                await leases.release(rt.store, lease, rt.clock.now(), "worker stopping")
            except Exception as exc:  # lost meanwhile, or the database is gone: the TTL decides
                log.warning(
                    "worker %s run %s token %s: lease not released: %r",
                    self.worker_id,
                    lease.run_id,
                    lease.token,
                    exc,
                )

    async def _announce(self) -> None:
        store, now = self.runtime.store, self.runtime.clock.now()
        async with store.transaction() as tx:
            await store.upsert_worker(
                tx,
                self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                concurrency=self.concurrency,
                now=now,
            )

    async def _goodbye(self) -> None:
        store = self.runtime.store
        try:
            async with store.transaction() as tx:
                await store.stop_worker(tx, self.worker_id, self.runtime.clock.now())
        except Exception as exc:
            log.warning("could not record worker stop: %r", exc)
