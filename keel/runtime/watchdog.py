"""The loop-lag watchdog: notice a worker's event loop blocked, say where, and record it.

An async node that calls blocking code (`time.sleep`, a sync HTTP client, a long computation)
holds the whole event loop: no other run of the worker steps, and the heartbeat cannot renew
any lease. Past the lease TTL other workers take the runs over; the worker was alive all along,
and must not be reported as dead.

How it notices: a ticker on the loop (`loop.call_later`, every `interval`, a few per second and
nothing per step) stamps the time; a daemon thread looks at the stamp as often. When the tick is
late by more than `threshold`, the thread reads the loop thread's stack (`sys._current_frames`:
the blocking code is on it at that moment): the context of the task the loop runs names the node
and the run (no bookkeeping per step), the innermost frame of the user's code says where. It
logs a WARNING once per block and, when the ticks resume, how long the block lasted. If the
watchdog thread itself woke late as well, the whole process was paused (SIGSTOP, a suspended
VM), not the loop: nothing is said.

What it records, and why that is fenced-correct (promise 5): a blocked worker may well keep its
lease for a while (the threshold is at most a third of the TTL, the heartbeat renews every
third), so *while the block lasts* the thread writes a `loop.blocked` event on the timeline of
every run the worker holds, each in a transaction fenced by that run's token, on a connection of
its own (the loop's are blocked). A run already taken over refuses it, as any stale write. When
the block ends, a `loop.unblocked` event under the same token says the lease survived it (a
takeover since refuses that one too). A claimer that gives up on a run after `max_attempts`
takeovers (`keel.core.leases`) reads them: a lease that lapsed during a recorded block that had
not ended failed the run as "blocked its worker's event loop", not "the worker died".
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from langchain_core.runnables.config import var_child_runnable_config

from keel.backends import connect
from keel.core.context import _current as run_context_var
from keel.core.errors import LeaseLost
from keel.core.leases import NOT_BLOCKING
from keel.core.lifecycle import Status
from keel.core.store.store import Lease, Store

log = logging.getLogger("keel.runtime.watchdog")


def _prefixes(*keys: str) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {p for key in keys if (raw := paths.get(key)) for p in (raw, str(Path(raw).resolve()))}
    return tuple(sorted(found))


_STDLIB = _prefixes("stdlib", "platstdlib")
_LIBRARIES = _prefixes("stdlib", "platstdlib", "purelib", "platlib")
_HANDLE_FILE = str(Path("asyncio", "events.py"))
"""Where `asyncio.Handle._run` lives: the frame that runs the loop's current callback."""


def default_threshold(lease_ttl: float) -> float:
    """How late the loop may be before it counts as blocked: max(1 s, a sixth of the lease),
    and never more than a third of it, so that a block is recorded while the lease still holds
    (the heartbeat renews every third of the TTL)."""
    return min(max(1.0, lease_ttl / 6), lease_ttl / 3)


@dataclass
class Block:
    """One block of the event loop, as the watchdog saw it."""

    since: float
    """The monotonic time of the last tick before the block."""
    node: str | None
    run_id: str | None
    where: str | None
    """The innermost frame of the user's code on the loop's stack: `function (file:line)`."""
    held: list[Lease] = field(default_factory=list)
    """The leases the worker held when the block was noticed."""
    blocked_for: float = 0.0
    """Seconds the block had lasted when noticed, then when it ended."""
    ended: threading.Event = field(default_factory=threading.Event)

    def place(self) -> str:
        if self.node is not None:
            where = f", at {self.where}" if self.where else ""
            run = f" of run {self.run_id}" if self.run_id else ""
            return f"in node {self.node!r}{run}{where}"
        return f"outside any node, at {self.where or 'unknown code'}"


class LoopWatchdog:
    """Watches one event loop from a daemon thread (`start` on the loop, `stop` when done).

    `held` lists the leases of the runs executing on the loop (called from the watchdog's
    thread: it must only read); `record`, if given, is called (in a thread of its own) with each
    block noticed, and may wait for `block.ended`."""

    def __init__(
        self,
        *,
        threshold: float,
        held: Callable[[], list[Lease]] = list,
        record: Callable[[Block], None] | None = None,
        lease_ttl: float | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.threshold = threshold
        self.interval = min(0.25, threshold / 4)
        self.lease_ttl = lease_ttl
        self.worker_id = worker_id
        self._held = held
        self._record = record
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._tick_at = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching the running loop (call on it)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stop.clear()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="keel-loop-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self._thread = None

    def _tick(self) -> None:
        # All the loop pays: a stamp and a timer, a few times a second.
        self._tick_at = time.monotonic()
        assert self._loop is not None
        self._handle = self._loop.call_later(self.interval, self._tick)

    def _watch(self) -> None:
        block: Block | None = None
        woke = floor = time.monotonic()
        loop = self._loop
        assert loop is not None
        while not self._stop.wait(self.interval) and not loop.is_closed():
            now = time.monotonic()
            if now - woke - self.interval > self.threshold / 2:
                # This thread woke late too: the whole process was paused (SIGSTOP, a suspended
                # machine), not the loop. The loop's lateness counts from now.
                floor = now
            woke = now
            tick = self._tick_at
            if block is not None:
                if tick > block.since:  # the loop runs again
                    self._ended(block, tick)
                    block = None
                continue
            late = now - max(tick, floor) - self.interval
            if late <= self.threshold:
                continue
            try:
                block = self._noticed(tick, late)
            except Exception:  # a watchdog must never take its worker down
                log.exception("loop watchdog: could not describe a blocked loop")
                block = Block(since=tick, node=None, run_id=None, where=None, blocked_for=late)
        if block is not None:  # stopped (from the loop, which runs again): the block is over
            self._ended(block, self._tick_at)

    def _noticed(self, tick: float, late: float) -> Block:
        node, run_id, where = _blocker(sys._current_frames().get(self._loop_thread))
        block = Block(
            since=tick, node=node, run_id=run_id, where=where, held=self._held(), blocked_for=late
        )
        log.warning(
            "event loop blocked %.1f s so far %s (an async node calling blocking code? %s)",
            late,
            block.place(),
            NOT_BLOCKING,
            extra=self._extra(block, "loop.blocked"),
        )
        if self._record is not None and block.held:
            threading.Thread(
                target=self._record, args=(block,), name="keel-loop-watchdog-record", daemon=True
            ).start()
        return block

    def _ended(self, block: Block, tick: float) -> None:
        # The loop stopped somewhere in the `interval` after the tick before the block, and
        # ran the late tick as it resumed: the middle of that range.
        block.blocked_for = max(tick - block.since - self.interval / 2, block.blocked_for)
        block.ended.set()
        lease = ""
        if self.lease_ttl is not None and block.blocked_for > self.lease_ttl:
            lease = (
                f"; longer than the {self.lease_ttl:g} s lease: other workers may have taken "
                "its runs over"
            )
        log.warning(
            "event loop blocked %.1f s %s%s",
            block.blocked_for,
            block.place(),
            lease,
            extra=self._extra(block, "loop.unblocked"),
        )

    def _extra(self, block: Block, event: str) -> dict[str, Any]:
        extra: dict[str, Any] = {"event": event, "duration": round(block.blocked_for, 3)}
        if block.run_id is not None:
            extra["run_id"] = block.run_id
        if block.node is not None:
            extra["node"] = block.node
        if self.worker_id is not None:
            extra["worker_id"] = self.worker_id
        return extra


def _blocker(frame: FrameType | None) -> tuple[str | None, str | None, str | None]:
    """The node and run the blocked loop is running, and the innermost frame of the user's own
    code on its stack (else of any library but the standard one), as `function (file:line)`.

    The node and the run come from the context the loop runs the current callback in (the
    `Handle._run` frame's handle: asyncio's handles are Python objects): the context of the
    node's task, where LangGraph keeps the node's config and Keel its run. A context is an
    immutable mapping: reading it from this thread is safe."""
    node = run_id = mine = other = None
    handled = False
    while frame is not None:
        code = frame.f_code
        path = code.co_filename
        if mine is None and not path.startswith(_LIBRARIES) and not path.startswith("<"):
            mine = _where(frame)
        if other is None and not path.startswith(_STDLIB):
            other = _where(frame)
        if not handled and code.co_name == "_run" and path.endswith(_HANDLE_FILE):
            handled = True
            context = getattr(frame.f_locals.get("self"), "_context", None)
            if isinstance(context, contextvars.Context):
                node, run_id = _running(context)
        frame = frame.f_back
    return node, run_id, mine or other


def _running(context: contextvars.Context) -> tuple[str | None, str | None]:
    run = context.get(run_context_var)
    config = context.get(var_child_runnable_config) or {}
    node = (config.get("metadata") or {}).get("langgraph_node")
    thread = (config.get("metadata") or {}).get("keel_run_id") or (
        config.get("configurable") or {}
    ).get("thread_id")
    run_id = run.run_id if run is not None else None if thread is None else str(thread)
    return (None if node is None else str(node)), run_id


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} ({Path(code.co_filename).name}:{frame.f_lineno})"


class BlockRecorder:
    """Records a block on the timelines of the runs the worker held (see the module's doc): on
    a connection of its own, in an event loop of its own, since the worker's is blocked."""

    def __init__(
        self,
        url: str,
        worker_id: str,
        lease_ttl: float,
        clock_override: Callable[[], float] | None = None,
    ) -> None:
        self.url = url
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.clock_override = clock_override
        self.timeout = max(min(lease_ttl / 3, 5.0), 0.5)
        """Seconds one recording may take (a connection, the writes) before it is dropped."""

    def __call__(self, block: Block) -> None:
        recorded = self._write(block, "loop.blocked")
        if recorded:
            block.ended.wait()
            self._write(block, "loop.unblocked", recorded)

    def _write(self, block: Block, kind: str, leases: list[Lease] | None = None) -> list[Lease]:
        """The leases whose runs got the event (stale ones refuse it)."""
        try:
            return asyncio.run(self._events(block, kind, leases or block.held))
        except Exception as exc:  # the database is away, or locked past the timeout
            log.warning("loop watchdog: could not record %s: %r", kind, exc)
            return []

    async def _events(self, block: Block, kind: str, leases: list[Lease]) -> list[Lease]:
        connector = connect(self.url, lease_ttl=self.lease_ttl or 30.0)
        connector.clock_override = self.clock_override
        store = Store(connector)
        done: list[Lease] = []
        try:
            await asyncio.wait_for(connector.open(), self.timeout)
            for lease in leases:
                data: dict[str, Any] = {"blocked_for": round(block.blocked_for, 3)}
                if kind == "loop.blocked":
                    data.update(node=block.node, where=block.where, lease_ttl=self.lease_ttl)
                    if block.run_id is not None and block.run_id != lease.run_id:
                        data["by_run"] = block.run_id
                try:
                    await asyncio.wait_for(self._event(store, lease, kind, data), self.timeout)
                except LeaseLost:
                    continue  # taken over already: the new owner's, not ours to write
                done.append(lease)
        finally:
            await connector.close()
        return done

    async def _event(self, store: Store, lease: Lease, kind: str, data: dict[str, Any]) -> None:
        async with store.transaction() as tx:
            run = await store.check_fence(tx, lease.run_id, lease.token)  # LeaseLost if stale
            if run["status"] != Status.RUNNING:
                raise LeaseLost("the run no longer runs under this lease")  # it ended here
            await store.add_event(
                tx, lease.run_id, kind, data, worker_id=self.worker_id, token=lease.token
            )
