"""`keel.App`: the public, synchronous face of Keel's async core.

Every method is a one-line hand-off to `keel.runtime.runtime.Runtime` on the App's own event loop
(see keel.core.portal); async code can use `app.aio` (the Runtime) directly.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from keel.core.clock import Clock
from keel.core.errors import UsageError
from keel.core.infra import Attempts
from keel.core.notifications import Notifier
from keel.core.retention import PruneReport
from keel.core.store.base import Row
from keel.core.waits import DecisionResult
from keel.core.workflows import Workflow
from keel.runtime.aio import AsyncApp
from keel.runtime.dispatcher import deliver_effects
from keel.runtime.replay import ReplayReport
from keel.runtime.runtime import DEFAULT_URL, RunDetails, Submission
from keel.runtime.summary import RunSummary
from keel.runtime.worker import WorkerStats, new_worker_id

F = TypeVar("F", bound=Callable[[], Any])


class App:
    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        artifacts_dir: str | Path | None = None,
        lease_ttl: float = 30.0,
        heartbeat_interval: float | None = None,
        max_input_bytes: int = 1_000_000,
        max_attempts: int = 5,
        max_infra_retries: int = 20,
        retry_backoff: float = 1.0,
        effect_timeout: float | None = None,
    ) -> None:
        """`url` defaults to $KEEL_DATABASE_URL, then `sqlite:///.keel/keel.db`.

        `max_attempts`: executions of one run that may crash outside its graph's nodes (with a
        backoff from `retry_backoff` seconds, doubling, capped at a minute) before it ends
        failed; `max_infra_retries`: executions an infrastructure fault may interrupt.
        `effect_timeout`: seconds one provider call of an effect that declares no `timeout=`
        may take (default $KEEL_EFFECT_TIMEOUT, else 60; docs/effects.md).
        """
        self.aio = AsyncApp(
            url or os.environ.get("KEEL_DATABASE_URL") or DEFAULT_URL,
            clock=clock,
            artifacts_root=artifacts_dir or os.environ.get("KEEL_ARTIFACTS_DIR", ".keel/artifacts"),
            lease_ttl=float(os.environ.get("KEEL_LEASE_TTL", lease_ttl)),
            heartbeat_interval=heartbeat_interval,
            max_input_bytes=max_input_bytes,
            attempts=Attempts(
                max_crashes=max_attempts,
                max_infra_retries=max_infra_retries,
                backoff=retry_backoff,
                max_backoff=max(60.0, retry_backoff),
            ),
            effect_timeout=effect_timeout,
        )
        self._portal = self.aio.portal
        # A script that never calls close() would otherwise end with its pool's tasks destroyed
        # mid-flight ("Task was destroyed but it is pending!"); the weak reference keeps the
        # exit hook from keeping the App alive.
        ref = weakref.ref(self)

        def close_at_exit() -> None:
            if (app := ref()) is not None:
                app.close()

        self._close_at_exit = close_at_exit
        atexit.register(close_at_exit)

    @property
    def url(self) -> str:
        return self.aio.url

    def workflow(
        self,
        name: str,
        version: str = "1",
        *,
        durability: str = "sync",
        termination: Callable[[Any], str | None] | None = None,
        recursion_limit: int = 100,
        max_concurrency: int | None = None,
    ) -> Callable[[F], F]:
        """Register a function returning an uncompiled LangGraph builder (a StateGraph).

        `termination(final_state)` may name the run's termination reason (e.g.
        "max_revisions_exceeded"); `max_concurrency` caps running runs across all workers.
        The graph is built and compiled here: one that cannot compile raises InvalidWorkflow.
        """

        def register(factory: F) -> F:
            self.aio.register(
                Workflow(
                    name,
                    version,
                    factory,
                    durability,
                    termination,
                    recursion_limit,
                    max_concurrency,
                )
            )
            return factory

        return register

    def add_notifier(self, notifier: Notifier) -> Notifier:
        """Deliver wait notifications (request, remind, escalate, decided, expired) through it."""
        if not isinstance(notifier, Notifier):
            raise UsageError("a notifier needs `name`, `kinds` and `send(notification)`")
        self.aio.notifiers[notifier.name] = notifier
        return notifier

    def migrate(self) -> list[str]:
        return self._portal.call(self.aio.migrate())

    def schema_version(self) -> int:
        """The database's schema version (0: never migrated); see `latest_schema_version`."""
        return self._portal.call(self.aio.schema_version())

    @property
    def latest_schema_version(self) -> int:
        """The schema version this Keel needs."""
        return self.aio.latest_schema_version

    def submit(
        self,
        workflow: str,
        *,
        job_id: str,
        input: Any,
        version: str | None = None,
        rerun: bool = False,
        if_exists: str = "new",
    ) -> Submission:
        """Admit a run (idempotent: the same job, input and version return the same run).

        The run's row; its `created` is False when the run already existed, its `other_runs`
        the job's runs with other input (`if_exists`: "new", "reuse" or "error")."""
        return self._portal.call(
            self.aio.submit(
                workflow,
                job_id=job_id,
                input=input,
                version=version,
                rerun=rerun,
                if_exists=if_exists,
            )
        )

    def get_run(self, run_id: str) -> RunDetails:
        return self._portal.call(self.aio.get_run(run_id))

    def list_runs(self, **filters: Any) -> list[Row]:
        return self._portal.call(self.aio.list_runs(**filters))

    def browse_runs(self, **filters: Any) -> list[Row]:
        """Runs newest first, filtered by status, workflow, job id prefix (`job_prefix`) and
        admission time (`since`, `until`), each with its number of `pending_waits`."""
        return self._portal.call(self.aio.browse_runs(**filters))

    def summary(self, run_id: str) -> RunSummary:
        """The run's outcome and why, per-node timing, attempts (keel.runtime.summary)."""
        return self._portal.call(self.aio.summary(run_id))

    def replay(self, run_id: str, from_step: int | None = None) -> ReplayReport:
        """Re-execute the run's graph in a throwaway copy (effects from its ledger, approvals as
        recorded) and report the first step that diverged (keel.runtime.replay)."""
        return self._portal.call(self.aio.replay(run_id, from_step))

    def approve(self, run_id: str, **kwargs: Any) -> DecisionResult:
        """Approve the run's pending approval; the first decision wins."""
        return self._portal.call(self.aio.approve(run_id, **kwargs))

    def reject(self, run_id: str, **kwargs: Any) -> DecisionResult:
        """Reject the run's pending approval; the first decision wins."""
        return self._portal.call(self.aio.reject(run_id, **kwargs))

    def get_wait(self, wait_id: str) -> Row:
        """One wait (approval, in-doubt effect, signal) by id; WaitNotFound if unknown."""
        return self._portal.call(self.aio.get_wait(wait_id))

    def pending_waits(self, limit: int = 100) -> list[Row]:
        """Open waits, oldest deadline first."""
        return self._portal.call(self.aio.pending_waits(limit))

    def browse_pending_waits(
        self, *, kind: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[Row]:
        """Open waits of one kind (None: all), oldest deadline first, paged."""
        return self._portal.call(
            self.aio.browse_pending_waits(kind=kind, limit=limit, offset=offset)
        )

    def running_runs(self, limit: int = 1000) -> list[Row]:
        """Runs some worker holds now, by owner (lease token, expiry, last heartbeat)."""
        return self._portal.call(self.aio.running_runs(limit))

    def database_now(self) -> float:
        """The database's clock (epoch seconds), which judges every lease and deadline: the
        console's "in 5 min" and "passed" are measured against it, not this host's clock."""
        return self._portal.call(self.aio.database_now())

    def workers(self, *, silent_for: float = 0.0) -> list[Row]:
        """Live workers (host, pid, concurrency, last heartbeat, `state`); with `silent_for`,
        also the workers that went quiet within that many seconds without stopping."""
        return self._portal.call(self.aio.workers(silent_for=silent_for))

    def upgrade_run(self, run_id: str, *, to: str, by: str | None = None) -> Row:
        """Move a queued or waiting run to version `to` of its workflow (registered in this
        app), if its checkpoint fits that version's graph (the nodes it stopped before exist).

        Refused with WorkflowVersionMismatch when it does not fit, UnknownWorkflow when `to` is
        not registered here, UsageError/RunFinished when the run is running or finished."""
        return self._portal.call(self.aio.upgrade_run(run_id, to=to, by=by))

    def stranded_runs(self, limit: int = 100) -> list[Row]:
        """Runs waiting for a worker of a workflow version that no worker serves."""
        return self._portal.call(self.aio.stranded_runs(limit=limit))

    def cancel(self, run_id: str, *, by: str | None = None) -> Row:
        """Cancel a run: queued or waiting at once, running at its next step boundary."""
        return self._portal.call(self.aio.cancel(run_id, by=by))

    def end_dead_lease(self, run_id: str, token: int) -> bool:
        """Your crash test saw the worker holding `run_id` under `token` exit: let the next
        worker take the run over at once instead of after the lease TTL."""
        return self._portal.call(self.aio.end_dead_lease(run_id, token))

    def resume(self, run_id: str, *, by: str | None = None) -> Row:
        """Put a failed run back in the queue: the same run continues from its last checkpoint
        with its ledger, so no effect it recorded is performed again (`rerun` starts afresh)."""
        return self._portal.call(self.aio.resume(run_id, by=by))

    def resolve_effect(
        self, run_id: str, *, performed: bool, result: Any = None, **kwargs: Any
    ) -> DecisionResult:
        """Tell an in-doubt effect's run whether the effect reached the provider."""
        return self._portal.call(
            self.aio.resolve_effect(run_id, performed=performed, result=result, **kwargs)
        )

    def effect_intents(
        self, *, state: str | None = None, run_id: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Outbox intents, oldest first, by state and/or run (see AsyncApp.effect_intents)."""
        return self._portal.call(self.aio.effect_intents(state=state, run_id=run_id, limit=limit))

    def retry_intent(self, intent_id: str, *, by: str | None = None) -> dict[str, Any]:
        """Deliver a dead intent again, its attempts from zero."""
        return self._portal.call(self.aio.retry_intent(intent_id, by=by))

    def resolve_intent(
        self, intent_id: str, *, performed: bool, result: Any = None, by: str | None = None
    ) -> dict[str, Any]:
        """Say whether an in-doubt (or dead) intent reached the provider."""
        return self._portal.call(
            self.aio.resolve_intent(intent_id, performed=performed, result=result, by=by)
        )

    def events_after(self, run_id: str, after: int = 0, limit: int = 500) -> list[Row]:
        """The run's timeline events with an id above `after`, in order (a resumable cursor)."""
        return self._portal.call(self.aio.events_after(run_id, after, limit))

    def run_status(self, run_id: str) -> str:
        """The run's status alone: cheaper than `get_run` for a poller."""
        return self._portal.call(self.aio.run_status(run_id))

    def metrics_snapshot(self) -> dict[str, Any]:
        """What /metrics reads from the database (runs, queue, ledger, waits, outbox, lag)."""
        return self._portal.call(self.aio.metrics_snapshot())

    def prune(
        self,
        *,
        older_than: str | float,
        statuses: list[str] | None = None,
        keep_failed: bool = False,
        dry_run: bool = False,
        batch_size: int = 200,
    ) -> PruneReport:
        """Delete finished runs that finished more than `older_than` ago ("30d", "12h", or
        seconds) with their checkpoints, ledger, waits, outbox, timeline and artifacts."""
        return self._portal.call(
            self.aio.prune(
                older_than=older_than,
                statuses=statuses,
                keep_failed=keep_failed,
                dry_run=dry_run,
                batch_size=batch_size,
            )
        )

    def run_worker(
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
        worker = self.aio.worker(
            concurrency=concurrency,
            stop_when_idle=stop_when_idle,
            grace=grace,
            worker_id=worker_id,
            max_clock_skew=max_clock_skew,
            prune_older_than=prune_older_than,
            prune_every=prune_every,
        )
        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():

            def on_signal(signum: int, frame: Any) -> None:
                self._portal.loop.call_soon_threadsafe(worker.stop)

            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, on_signal)
        try:
            return self._portal.call(worker.run())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def run_dispatcher(self, *, handle_signals: bool = True) -> None:
        """Deliver outbox effects (every worker does it too) until SIGTERM/SIGINT, executing
        no run: `keel dispatcher APP`."""
        stopping: list[asyncio.Event] = []
        asked = threading.Event()  # a signal that comes before the loop's event exists

        async def serve() -> None:
            await self.aio.open()
            stopping.append(asyncio.Event())
            if asked.is_set():
                return
            await deliver_effects(self.aio, new_worker_id(), stopping[0])

        def stop() -> None:
            asked.set()
            if stopping:
                self._portal.loop.call_soon_threadsafe(stopping[0].set)

        previous: dict[signal.Signals, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda signum, frame: stop())
        try:
            self._portal.call(serve())
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def close(self) -> None:
        atexit.unregister(self._close_at_exit)
        if self._portal.started:
            self._portal.call(self.aio.close())
        self._portal.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
