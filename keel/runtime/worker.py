"""The worker: claim runs up to its concurrency, execute them, keep their leases alive.

Runs are asyncio tasks (sync nodes run in threads). Stopping: no new claims, running runs get
`grace` seconds, then are cancelled and their leases given back so another worker resumes them
at once. The heartbeat, clock checks and the backoff while the database is away are the
worker's upkeep (keel.runtime.upkeep); the runs it held through an outage resume from their
last checkpoint, here or on another worker. The worker also says, once per run, when a run of
one of its workflows is under a version that no live worker executes (stranded).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import uuid
from typing import Any

from keel.core import leases, logs, retention
from keel.core.clock import DEFAULT_MAX_SKEW, MAX_SKEW_ENV
from keel.core.effects import dispatch as effect_dispatch
from keel.core.errors import WorkflowVersionMismatch
from keel.core.leases import LeaseEnd
from keel.core.lifecycle import FINISHED
from keel.core.schedules import SCHEDULE_WAKE
from keel.core.store.base import Row
from keel.core.store.intent_queries import OUTBOX_WAKE
from keel.core.store.store import Lease
from keel.core.workflows import Workflows
from keel.langgraph.executor import Executor, Outcome
from keel.runtime.dispatcher import SAFETY_POLL_INTERVAL, deliver_effects
from keel.runtime.handoff import Handoff
from keel.runtime.ports import WorkerHost
from keel.runtime.records import WorkerStats as WorkerStats
from keel.runtime.schedules import AsyncSchedules, run_scheduler
from keel.runtime.upkeep import QUIET_STRANDED_CHECK_INTERVAL, WorkerUpkeep
from keel.runtime.watchdog import LoopWatchdog, default_threshold

log = logging.getLogger("keel.runtime.worker")


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


DEFAULT_CONCURRENCY = 10
"""Runs one worker process executes at once, unless told otherwise. An agent's run spends most
of its time waiting (a model, a tool, the database's commit), so a worker overlaps several;
LangGraph Platform's default is also 10 jobs per worker. A worker process at 10 drained a
backlog of 5-step runs 1.1x (PostgreSQL) to 1.5x (SQLite) faster than at 4, measured side by
side (bench case 4b with `KEEL_BENCH_COMPARE`)."""


class Worker(WorkerUpkeep):
    def __init__(
        self,
        runtime: WorkerHost,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        worker_id: str | None = None,
        poll_interval: float = 0.05,
        max_poll_interval: float = 1.0,
        stop_when_idle: bool = False,
        grace: float = 30.0,
        sweep_interval: float = 1.0,
        safety_poll_interval: float = SAFETY_POLL_INTERVAL,
        sweep_before_exit: bool = True,
        prune_older_than: str | float | None = None,
        prune_interval: str | float = 3600.0,
        max_clock_skew: float | None = None,
        clock_check_interval: float = 60.0,
        loop_block_threshold: float | None = None,
    ) -> None:
        """`max_clock_skew` (default `$KEEL_MAX_CLOCK_SKEW`, else 300 s; 0: no limit): how far
        this host's clock may be from the database's for the worker to start.
        `loop_block_threshold`: seconds the event loop may be blocked (an async node calling
        blocking code) before the worker says so and records it on the timelines of the runs it
        holds (default: max(1 s, lease TTL / 6), at most a third of the TTL; 0: never)."""
        self.runtime = runtime
        self.loop_block_threshold = (
            default_threshold(runtime.services.lease_ttl)
            if loop_block_threshold is None
            else loop_block_threshold
        )
        self.watchdog: LoopWatchdog | None = None
        if max_clock_skew is None:
            max_clock_skew = float(os.environ.get(MAX_SKEW_ENV) or DEFAULT_MAX_SKEW)
        self.max_clock_skew = max_clock_skew
        self.clock_check_interval = clock_check_interval
        self.clock_skew: float | None = None
        """This host's clock minus the database's, as last measured."""
        self._skew_warned = False
        self._stranded_logged: set[str] = set()
        self._next_stranded_check = 0.0
        self._next_quiet_sweep = 0.0
        self._quiet_backoff = poll_interval
        self._next_look: float | None = None  # when the last quiet look said to look again
        self.sweep_interval = sweep_interval
        self.safety_poll_interval = safety_poll_interval
        self.sweep_before_exit = sweep_before_exit
        self.concurrency = max(1, concurrency)
        self.worker_id = worker_id or new_worker_id()
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.stop_when_idle = stop_when_idle
        self.grace = grace
        # Checked here, not at the first scheduled prune an hour later.
        self.prune_older_than = (
            None if prune_older_than is None else retention.parse_age(prune_older_than)
        )
        self.prune_interval = retention.parse_age(prune_interval)
        self.stats = WorkerStats()
        self._tasks: dict[str, tuple[Lease, asyncio.Task[Outcome]]] = {}
        self._stopping = asyncio.Event()
        self._stop_requests = 0
        self.database_unavailable_since: float | None = None
        """Set (loop time) while the worker cannot reach its database and waits for it."""
        self._outage_attempts = 0
        self._executor: Executor | None = None
        self.serving: Workflows = runtime.workflows
        """The workflows this worker executes: its runtime's, but those whose graph differs
        from the one their version was first served with (`refused`, key -> what differs)."""
        self.refused: dict[str, str] = {}
        self._slot_freed: asyncio.Event | None = None
        self._handoff = Handoff(
            runtime.services, runtime.workflows, self.worker_id, free=self._room, start=self._start
        )
        self._backlog = False
        """The last claim filled every slot it asked for: runs may still be queued."""
        self._pool_room = 0  # runs this worker made room for in its connector's pool
        self._leaving: set[asyncio.Task[Outcome]] = set()
        """Executions that ended with their successor's claim and have not returned yet."""
        self._successor = Handoff(
            runtime.services,
            runtime.workflows,
            self.worker_id,
            free=self._after_end,
            start=self._succeed,
            empty=self._no_successor,
        )
        """A run ending claims the next one in its last transaction (keel.runtime.handoff)."""

    def stop(self) -> None:
        """First call: drain (runs stop at their next step boundary). Second call: stop now."""
        self._stop_requests += 1
        self._stopping.set()
        self.runtime.set_draining(True)
        if self._stop_requests > 1:
            for _, task in self._tasks.values():
                task.cancel()

    async def run(self) -> WorkerStats:
        with logs.bind(worker_id=self.worker_id):
            try:
                return await self._run()
            finally:
                if self._pool_room:  # given back: a later worker on this runtime counts its own
                    await self.runtime.connector.make_room(-self._pool_room)
                    self._pool_room = 0

    async def _run(self) -> WorkerStats:
        rt = self.runtime
        await rt.open()
        await rt.connector.make_room(self.concurrency)
        self._pool_room = self.concurrency
        rt.check_workflows()  # a graph that cannot compile is refused here, not at every claim
        self._refuse(await rt.hold_shapes(self.worker_id))
        await self._check_clock()  # ClockSkew: refuse to start
        rt.set_draining(False)  # an earlier worker's stop on this runtime is over
        executor = self._executor = rt.executor(self.worker_id)
        wake = self._slot_freed = rt.waker()
        heartbeat = asyncio.create_task(self._heartbeat())
        effects_wake = asyncio.Event()  # the dispatcher's own: the claim loop clears `wake`
        schedules_wake = asyncio.Event()  # the scheduler's: a schedule changed

        def woken_by_notify(payload: str | None) -> None:
            # An intent's wake-up is the dispatcher's alone: a claim loop woken for it would
            # query the database for nothing, beside the run it is there to start.
            if payload is None or not payload.startswith(OUTBOX_WAKE):
                wake.set()
            if payload is None or payload.startswith(OUTBOX_WAKE):
                effects_wake.set()
            if payload is None or payload.startswith(SCHEDULE_WAKE):
                schedules_wake.set()

        listener = asyncio.create_task(rt.connector.listen("keel_wake", woken_by_notify))
        pruner = asyncio.create_task(self._prune()) if self.prune_older_than else None
        quiet = rt.connector.notifies and not self.stop_when_idle
        deliverer = asyncio.create_task(
            deliver_effects(
                rt.services,
                self.worker_id,
                self._stopping,
                wake=effects_wake if quiet else None,
                safety_poll=self.safety_poll_interval,
            )
        )
        # Schedules of the workflows served here: each worker fires due ticks, exactly once
        # between them all (keel.core.schedules).
        scheduler = asyncio.create_task(
            run_scheduler(
                rt,
                self.serving,
                self._stopping,
                AsyncSchedules(rt),
                wake=schedules_wake if quiet else None,
            )
        )
        await self._guarded(self._announce())
        log.info(
            "worker %s started: concurrency %d, workflows %s",
            self.worker_id,
            self.concurrency,
            ", ".join(sorted(self.serving.keys())) or "none",
            extra={"event": "worker.started"},
        )
        # Quiet (PostgreSQL, a long-lived worker): claim when woken (a NOTIFY, a run of ours
        # ending) or when the database says work is there or falls due, and look at least
        # every `safety_poll_interval`. Otherwise poll with backoff, as SQLite's workers in
        # other processes cannot wake this one, and sweep every `sweep_interval`.
        delay = self.poll_interval
        next_sweep = 0.0
        loop = asyncio.get_running_loop()
        woken = True
        rt.add_taker(self._handoff.open(loop))
        executor.successor = self._successor.open(loop)
        self._watch_loop()
        try:
            while not self._stopping.is_set():
                # Cleared before the look, not after it: a wake-up that comes while this pass
                # runs (a run admitted after its claim found nothing) starts another pass at
                # once instead of being lost until the next poll.
                wake.clear()
                try:
                    if quiet:
                        delay, claimed = await self._quiet_pass(executor, woken)
                    else:
                        if loop.time() >= next_sweep:
                            next_sweep = loop.time() + self.sweep_interval
                            await self._sweep()
                        claimed = await self._fill(executor)
                        if await self._idle_done(claimed):
                            break
                    self._reachable()
                except Exception as exc:
                    if not rt.services.store.is_infrastructure(exc):
                        raise
                    await self._wait_for_database(exc)
                    continue
                if not quiet:
                    delay = (
                        self.poll_interval if claimed else min(delay * 2, self.max_poll_interval)
                    )
                waiters: list[asyncio.Future[Any]] = [
                    asyncio.ensure_future(wake.wait()),
                    asyncio.ensure_future(self._stopping.wait()),
                ]
                waiters += [task for _, task in self._tasks.values()]
                try:
                    done, _ = await asyncio.wait(
                        waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for w in waiters[:2]:  # ours; the runs' tasks go on
                        w.cancel()
                woken = bool(done)
                if done & {t for _, t in self._tasks.values()}:
                    delay = self.poll_interval
        finally:
            rt.remove_taker(self._handoff.close())
            executor.successor = self._successor.close()
            await self._drain()
            background = [heartbeat, listener, deliverer, scheduler, *([pruner] if pruner else [])]
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            if self.watchdog is not None:
                self.watchdog.stop()
            await self._goodbye()
        return self.stats

    async def _idle_done(self, claimed: int) -> bool:
        """A stop-when-idle worker with nothing left to do anywhere: time to leave."""
        rt = self.runtime
        if not self.stop_when_idle or claimed or self._tasks or self._reserved():
            return False
        # Undelivered intents first: the delivery that queues a run awaiting it commits with
        # it, so a run the check below misses is not left queued.
        if await effect_dispatch.due_soon(rt.services):
            return False
        if await rt.services.store.count_unfinished(self.serving.keys()) != 0:
            return False
        # Deliver what the last runs announced (a wait's request) before leaving, and stay if
        # a due deadline queued a run meanwhile.
        if not self.sweep_before_exit:
            return True
        await self._sweep()
        return await rt.services.store.count_unfinished(self.serving.keys()) == 0

    async def _quiet_pass(self, executor: Executor, woken: bool) -> tuple[float, int]:
        """One look of a quiet worker: sweep if something fell due, claim if a run is there
        (or a wake-up says one may be), and say how long to sleep before the next look."""
        rt = self.runtime
        loop = asyncio.get_running_loop()
        if woken and self._next_look is not None and not self._room(self._handoff.reserved):
            # Full: what a wake-up announces waits for a slot, and a run of ours ending wakes
            # this loop again. What falls due is looked at when the last look said.
            return max(self._next_look - loop.time(), 0.0), 0
        keys, outbox = self.serving.keys(), bool(rt.services.notifiers)
        # A wake-up is most often a run just admitted: it starts first, and the look at what
        # else is due (for how long to sleep) runs beside it rather than before it.
        claimed = await self._fill(executor) if woken else 0
        due = await rt.services.store.next_due(keys, outbox=outbox)
        swept = False
        if due.sweep_in == 0.0 and loop.time() >= self._next_quiet_sweep:
            # Not again before `sweep_interval`, even if something is still due (past the
            # pass's limit, or held by another sweeper): a retry, not a spin.
            self._next_quiet_sweep = loop.time() + self.sweep_interval
            await self._sweep()
            swept = True
            due = await rt.services.store.next_due(keys, outbox=outbox)
        elif loop.time() >= self._next_stranded_check:
            self._next_stranded_check = loop.time() + QUIET_STRANDED_CHECK_INTERVAL
            await self._report_stranded()
        work = due.queued or due.lease_in == 0.0
        if work and (swept or not woken):
            claimed += await self._fill(executor)
        # Work the database showed but no claim got (a workflow at its limit, a row another
        # transaction holds): look again after a backoff, not at once.
        if claimed or not work:
            self._quiet_backoff = self.poll_interval
        else:
            self._quiet_backoff = min(self._quiet_backoff * 2, self.safety_poll_interval)
        sweep_in = due.sweep_in
        if sweep_in == 0.0:
            sweep_in = max(self._next_quiet_sweep - loop.time(), 0.0)
        waits = [self.safety_poll_interval]
        waits += [t for t in (due.lease_in, sweep_in) if t]
        delay = max(min(waits), self._quiet_backoff)
        self._next_look = loop.time() + delay
        return delay, claimed

    def _room(self, reserved: int) -> bool:
        """Whether one more run fits beside those running and `reserved` for a hand-off (and
        those held for successors)."""
        return self._free() - self._successor.reserved > reserved

    def _reserved(self) -> int:
        """Slots held for claims committing with another write (an admission, a run's end)."""
        return self._handoff.reserved + self._successor.reserved

    def _busy(self) -> int:
        """Slots taken: running executions, but those whose slot went to their successor."""
        return len(self._tasks) - len(self._leaving)

    def _free(self) -> int:
        return 0 if self._stopping.is_set() else self.concurrency - self._busy()

    async def _fill(self, executor: Executor) -> int:
        """Claim runs into every free slot: several in one transaction (`claim_batch`)."""
        rt = self.runtime
        claimed = 0
        while (free := self._free() - self._reserved()) > 0:
            got, full = await leases.claim_batch(
                rt.services.store,
                self.worker_id,
                self.serving.keys(),
                rt.services.lease_ttl,
                free,
                self.serving.limits(),
                max_crashes=executor.services.attempts.max_crashes,
            )
            # Every slot asked for was filled: more runs may be queued, and a run ending here
            # claims the next one in its own last transaction (`_successor`).
            self._backlog = full
            claimed += len(got)
            for lease, row in got:
                self._start(lease, row)
            if not full:
                break
        return claimed

    def _after_end(self, reserved: int) -> bool:
        """Whether a run of this worker that is ending claims its successor in its own last
        transaction: only while a backlog is believed to be there (the last claim filled every
        slot it asked for), into the slot the ending run gives up."""
        if not self._backlog or self._stopping.is_set():
            return False
        # The ending run's slot (it is among `_tasks`) goes to its successor, and so does each
        # other ending run's: only admissions' hand-offs take slots on top.
        return self._busy() + self._handoff.reserved <= self.concurrency

    def _succeed(self, lease: Lease, row: Row) -> None:
        """Execute the run an ending run of this worker claimed with its end (called in that
        run's task, its end committed): the slot is the successor's from now on, though the
        ending task (still renewed, still awaited at a stop) finishes after it starts."""
        current = asyncio.current_task()
        if current is not None:
            self._leaving.add(current)
        self._start(lease, row)

    def _no_successor(self) -> None:
        self._backlog = False  # the queue is empty: runs end alone until a claim fills up again

    def _start(self, lease: Lease, row: Row) -> None:
        """Execute a run this worker claimed (here, or with its admission: `Handoff`)."""
        assert self._executor is not None
        self.stats.claimed += 1  # the claim's timeline event was logged as it committed
        task = asyncio.create_task(
            self._executor.execute(lease, row), name=f"keel-run-{lease.run_id}"
        )
        self._tasks[lease.run_id] = (lease, task)
        task.add_done_callback(functools.partial(self._done, lease.run_id))

    def _done(self, run_id: str, task: asyncio.Task[Outcome]) -> None:
        self._leaving.discard(task)
        # A stale execution ending must not forget a newer one of the same run (a re-claim).
        if (entry := self._tasks.get(run_id)) is not None and entry[1] is task:
            del self._tasks[run_id]
        if self._slot_freed is not None:
            # A slot is free: the claim loop looks again. Waiting on the run's task alone loses
            # an ending that comes while a pass runs (the task is gone from the next wait), and
            # a full quiet worker would then sleep until its safety poll with runs queued.
            self._slot_freed.set()
        if task.cancelled():
            # Stopped past its grace (or at once): `_drain` gives its lease back.
            self.stats.lost += 1
            return
        if task.exception() is not None:
            log.error(
                "worker %s run %s: executor crashed: %r",
                self.worker_id,
                run_id,
                task.exception(),
                extra={"event": "executor.crashed", "run_id": run_id},
            )
            return
        outcome = task.result()
        if outcome in (LeaseEnd.LOST, LeaseEnd.RELEASED, LeaseEnd.RETRY):
            self.stats.lost += 1
        elif outcome in FINISHED:
            self.stats.finished += 1
        else:
            self.stats.waiting += 1

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
                await leases.release(rt.services.store, lease, "worker stopping")
            except Exception as exc:  # lost meanwhile, or the database is gone: the TTL decides
                log.warning(
                    "worker %s run %s token %s: lease not released: %r",
                    self.worker_id,
                    lease.run_id,
                    lease.token,
                    exc,
                )

    def _refuse(self, refused: dict[str, str]) -> None:
        """Serve every workflow but those whose graph is not their version's: say each once,
        loudly; with none left, refuse to start (WorkflowVersionMismatch)."""
        self.refused = refused
        self.serving = self.runtime.workflows.without(refused)
        self._handoff.workflows = self._successor.workflows = self.serving
        for key, why in sorted(refused.items()):
            log.error(
                "worker %s refuses %s: its graph differs from the one version %s was first "
                "served with (%s); runs of it stay queued (stranded) until a worker with that "
                "graph serves it. Give the edited graph a new version (@app.workflow(..., "
                'version="N")) and move runs with `keel runs upgrade RUN --to N`',
                self.worker_id,
                key,
                key.rpartition("@")[2],
                why,
                extra={"event": "worker.refused", "workflow": key},
            )
        if refused and not self.serving.keys():
            raise WorkflowVersionMismatch(
                f"every workflow of this worker has a graph other than its version's: "
                f"{'; '.join(f'{k}: {w}' for k, w in sorted(refused.items()))}"
            )
