"""`app.aio`: the App's operations as coroutines, with the same names and return types.

The Runtime holds every operation on runs; this adds the one that needs the worker (which
itself builds on the Runtime), so that `await app.aio.run_worker()` mirrors `app.run_worker()`.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Any

from keel.core.effects import dispatch as effect_dispatch
from keel.core.effects.outbox import IntentState, public
from keel.core.errors import UsageError
from keel.runtime import replay
from keel.runtime.dispatcher import deliver_effects
from keel.runtime.replay import ReplayReport
from keel.runtime.runtime import Runtime
from keel.runtime.summary import RunSummary, summarize
from keel.runtime.worker import Worker, WorkerStats, new_worker_id


class AsyncApp(Runtime):
    # -- the outbox of user effects (keel.core.effects.outbox, docs/outbox.md) -----------------

    async def effect_intents(
        self, *, state: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Outbox intents, oldest first: all, or those in `state` (pending, sending,
        delivered, dead, in_doubt) and/or of one run."""
        if state is not None and state not in set(IntentState):
            raise UsageError(f"state must be one of {', '.join(IntentState)}, not {state!r}")
        await self.open()
        rows = await self.store.list_effect_intents(status=state, run_id=run_id, limit=limit)
        return [public(r) for r in rows]

    async def retry_intent(self, intent_id: str, *, by: str | None = None) -> dict[str, Any]:
        """Deliver a dead intent again, its attempts from zero (a timeline event of its run)."""
        await self.open()
        return public(await effect_dispatch.retry(self.services, intent_id, by=by))

    async def resolve_intent(
        self, intent_id: str, *, performed: bool, result: Any = None, by: str | None = None
    ) -> dict[str, Any]:
        """A person's answer on an in-doubt (or dead) intent: it reached the provider
        (delivered, never resent) or not (delivered now, under the same id)."""
        await self.open()
        return public(
            await effect_dispatch.resolve(
                self.services, intent_id, performed=performed, result=result, by=by
            )
        )

    async def summary(self, run_id: str) -> RunSummary:
        """The run's outcome and why, per-node timing, attempts (keel.runtime.summary)."""
        return summarize(await self.get_run(run_id), await self.database_now())

    async def run_dispatcher(self, *, handle_signals: bool = True) -> None:
        """Deliver outbox effects (every worker does it too) until SIGTERM/SIGINT, executing
        no run: `keel dispatcher APP`."""
        await self.open()
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        handled = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stopping.set)
                handled.append(sig)
        try:
            await deliver_effects(self, new_worker_id(), stopping)
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    async def replay(self, run_id: str, from_step: int | None = None) -> ReplayReport:
        """Re-execute the run's graph in a throwaway copy, effects served from its ledger and
        approvals answered as recorded; report the first step that diverged
        (keel.runtime.replay). Nothing of the run is written, no effect is performed."""
        return await replay.replay(self, run_id, from_step)

    def worker(
        self,
        *,
        concurrency: int = 4,
        stop_when_idle: bool = False,
        grace: float = 30.0,
        worker_id: str | None = None,
        max_clock_skew: float | None = None,
        prune_older_than: str | float | None = None,
        prune_every: str | float = 3600.0,
    ) -> Worker:
        """A worker on this app, not started (`await worker.run()`; `worker.stop()` drains).

        With `prune_older_than` it prunes finished runs older than that at its start and then
        every `prune_every` (a duration: `1h`, `15m`, seconds).

        Its run() raises ClockSkew if this host's clock is more than `max_clock_skew` seconds
        (default $KEEL_MAX_CLOCK_SKEW, else 300; 0: no limit) from the database's."""
        return Worker(
            self,
            concurrency=concurrency,
            stop_when_idle=stop_when_idle,
            grace=grace,
            worker_id=worker_id,
            max_clock_skew=max_clock_skew,
            prune_older_than=prune_older_than,
            prune_interval=prune_every,
        )

    async def run_worker(
        self,
        *,
        concurrency: int = 4,
        stop_when_idle: bool = False,
        grace: float = 30.0,
        worker_id: str | None = None,
        handle_signals: bool = True,
        max_clock_skew: float | None = None,
        prune_older_than: str | float | None = None,
        prune_every: str | float = 3600.0,
    ) -> WorkerStats:
        """Execute runs until stopped (SIGTERM/SIGINT: drain; twice: stop now).

        ClockSkew if this host's clock is more than `max_clock_skew` seconds (default
        $KEEL_MAX_CLOCK_SKEW, else 300; 0: no limit) from the database's."""
        worker = self.worker(
            concurrency=concurrency,
            stop_when_idle=stop_when_idle,
            grace=grace,
            worker_id=worker_id,
            max_clock_skew=max_clock_skew,
            prune_older_than=prune_older_than,
            prune_every=prune_every,
        )
        loop = asyncio.get_running_loop()
        # Only the main thread may take signals; elsewhere the caller stops the worker.
        handled = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.stop)
                handled.append(sig)
        try:
            return await worker.run()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
