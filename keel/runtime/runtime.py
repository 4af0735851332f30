"""The Runtime: Keel's async core put together (workflows, connector, services, saver) and the
operations on runs that the App, the CLI and the HTTP service call."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from pathlib import Path
from typing import Any

from keel.backends import connect
from keel.backends.sqlite import SqliteConnector
from keel.core import failed_runs, leases, notification_outbox, retention, runs, versions, waits
from keel.core.artifacts import RunArtifacts
from keel.core.clock import Clock, SystemClock, database_override, parse_duration
from keel.core.deadlines import sweep_deadlines
from keel.core.effects.rows import DEFAULT_TIMEOUT
from keel.core.errors import RunNotFound, UsageError, WaitNotFound, WorkflowVersionMismatch
from keel.core.ids import validate_run_id
from keel.core.infra import Attempts
from keel.core.notifications import Notifier
from keel.core.portal import Portal
from keel.core.services import Services
from keel.core.store.base import Row
from keel.core.store.store import Store
from keel.core.workflows import Workflow, Workflows
from keel.langgraph import traces
from keel.langgraph.executor import Executor
from keel.langgraph.graphs import checkpoint_misfits, compile_graph
from keel.langgraph.inputs import check_input, learn_input_schema
from keel.langgraph.savers import FencedSaver, make_saver
from keel.runtime.handoff import Claim, Reserved, Taker
from keel.runtime.records import RunDetails as RunDetails
from keel.runtime.records import Submission as Submission

log = logging.getLogger("keel.runtime")

DEFAULT_URL = "sqlite:///.keel/keel.db"
EFFECT_TIMEOUT_ENV = "KEEL_EFFECT_TIMEOUT"


class Runtime:
    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        artifacts_root: str | Path = ".keel/artifacts",
        lease_ttl: float = 30.0,
        heartbeat_interval: float | None = None,
        max_input_bytes: int = 1_000_000,
        portal: Portal | None = None,
        attempts: Attempts | None = None,
        effect_timeout: float | None = None,
    ) -> None:
        self.url = url
        self.heartbeat_interval = heartbeat_interval or lease_ttl / 3
        self.max_input_bytes = max_input_bytes
        self.workflows = Workflows()
        self.connector = connect(url, lease_ttl=lease_ttl)
        self.services = Services(
            store=Store(self.connector),
            clock=clock or SystemClock(),
            portal=portal or Portal(),
            lease_ttl=lease_ttl,
            artifacts_root=Path(artifacts_root),
            wake=self.wake,
            attempts=attempts or Attempts(),
            effect_timeout=_effect_timeout(effect_timeout),
        )
        self.connector.clock_override = database_override(self.clock)
        self.saver: FencedSaver | None = None
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self._wakers: list[asyncio.Event] = []
        self._takers: list[Taker] = []
        self._checked: set[str] = set()

    # What the core needs, handed down as `services`; read here for callers above the core.
    @property
    def store(self) -> Store:
        return self.services.store

    @property
    def clock(self) -> Clock:
        return self.services.clock

    @property
    def portal(self) -> Portal:
        return self.services.portal

    @property
    def lease_ttl(self) -> float:
        return self.services.lease_ttl

    @property
    def artifacts_root(self) -> Path:
        return self.services.artifacts_root

    @property
    def notifiers(self) -> dict[str, Notifier]:
        return self.services.notifiers

    @property
    def dialect(self) -> str:
        """The database: "sqlite" or "postgres"."""
        return self.store.dialect

    @property
    def latest_schema_version(self) -> int:
        """The schema version this Keel needs (its last migration)."""
        return self.store.latest_version

    def register(self, workflow: Workflow) -> None:
        """Add a workflow whose graph compiles; InvalidWorkflow (nothing registered) if not."""
        # Built once here (submit reads its input schema); a worker compiles its own, fenced.
        learn_input_schema(workflow, compile_graph(workflow))
        self.workflows.add(workflow)
        self._checked.add(workflow.key)

    def check_workflows(self) -> None:
        """InvalidWorkflow unless every registered graph compiles (once per workflow)."""
        for workflow in self.workflows.all():
            self._check(workflow)

    def _check(self, workflow: Workflow) -> None:
        if workflow.key not in self._checked:
            learn_input_schema(workflow, compile_graph(workflow))
            self._checked.add(workflow.key)

    def adopt(self, workflows: Workflows) -> None:
        """Serve another runtime's registry (shared, not copied) on this one's database."""
        self.workflows = workflows

    def fencing(self) -> FencedSaver:
        """The open runtime's fenced saver."""
        if self.saver is None:
            raise RuntimeError("the runtime is not open")
        return self.saver

    def set_draining(self, draining: bool) -> None:
        """Runs give their lease back at their next step boundary while draining."""
        if self.saver is not None:
            self.saver.draining = draining

    async def open(self, *, check_schema: bool = True) -> None:
        if self._opened:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            await self.connector.open()
            if check_schema:
                await self.store.check_schema()
            saver = make_saver(self.connector, self.store)
            if isinstance(self.connector, SqliteConnector):
                await saver.setup()  # idempotent; its lazy setup would commit our transactions
                # Transactions commit on the loop's own thread while at most one execution runs.
                self.connector.commit_here_when = saver.alone
            self.saver = saver
            self._opened = True

    async def close(self) -> None:
        await self.connector.close()
        self._opened = False

    async def schema_version(self) -> int:
        """The database's schema version (0: never migrated), read without checking it."""
        await self.connector.open()
        return await self.store.schema_version()

    async def check_schema(self) -> None:
        """SchemaMismatch, saying what to do, unless the schema is the version this Keel needs."""
        await self.connector.open()
        await self.store.check_schema()

    async def migrate(self) -> list[str]:
        await self.connector.open()
        applied = await self.store.migrate()
        saver = make_saver(self.connector, self.store)
        for attempt in range(1, 6):
            try:
                await saver.setup()
                break
            except Exception:
                # LangGraph's setup races a concurrent one on PostgreSQL (both CREATE TABLE IF
                # NOT EXISTS, both record the same version); the next try sees what the other
                # created. Not under Keel's lock: its CREATE INDEX CONCURRENTLY would wait on
                # the lock's waiters forever.
                if attempt == 5:
                    raise
                await asyncio.sleep(0.05 * attempt)
        return applied

    # -- runs --------------------------------------------------------------------------------

    async def submit(
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

        When the job already has runs with other input (`other_runs`), `if_exists` says what to
        do: "new" admits this one too, "reuse" returns the job's latest run, "error" raises
        JobExists."""
        await self.open()
        wf = self.workflows.get(workflow, version)
        self._check(wf)  # refused before admission: a run of it could never execute
        taker, claim = self._taker()
        slot = Reserved(taker) if taker is not None else None
        try:
            admitted = await runs.admit(
                self.store,
                workflow=wf.name,
                version=wf.version,
                job_id=job_id,
                input=input,
                rerun=rerun,
                max_input_bytes=self.max_input_bytes,
                if_exists=if_exists,
                check=functools.partial(check_input, wf),
                then=claim,
            )
            if admitted.created:
                await self._trace(admitted.row)  # before the worker it goes to can start it
            if slot is not None:
                await slot.adopt(admitted.then)
        finally:
            if slot is not None:
                slot.give_back()
        handed = admitted.then is not None and admitted.then["run_id"] == admitted.row["run_id"]
        if admitted.created and not handed:  # a worker here took it: nothing to wake for
            self.wake()
        return Submission(admitted.row, created=admitted.created, other_runs=admitted.other_runs)

    async def _trace(self, row: Row) -> None:
        """Root the new run's trace here, linked to the submitter's span (keel.langgraph.traces);
        a failure only leaves it to the first worker."""
        tracer = traces.active()
        if tracer is None:
            return
        try:
            await tracer.root(self.store, row, by="submit")
        except Exception as exc:
            log.warning("run %s: could not keep its trace context (%r)", row["run_id"], exc)

    async def get_run(self, run_id: str) -> RunDetails:
        await self.open()
        validate_run_id(run_id)
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        for_run = RunArtifacts(self.artifacts_root, run_id).list()
        return RunDetails(
            run=run,
            timeline=await self.store.events(run_id),
            effects=await self.store.effects(run_id),
            waits=await self.store.waits(run_id),
            artifacts=for_run,
            notifications=await self.store.intents(run_id),
            intents=await self.store.list_effect_intents(run_id=run_id, limit=100_000),
            stranded=versions.is_stranded(run, await self.served_versions()),
        )

    async def list_runs(self, **filters: Any) -> list[Row]:
        """Runs, newest first, each with its derived `stranded` flag; `since` and `until`
        (admission time, until excluded) take epoch seconds, ages (2h, 7d) or ISO times."""
        await self.open()
        if filters.get("since") is not None or filters.get("until") is not None:
            now = await self.store.database_now()
            for bound in ("since", "until"):
                filters[bound] = retention.parse_moment(filters.get(bound), now)
        rows = await self.store.list_runs(**filters)
        served = await self.served_versions()
        for row in rows:
            row["stranded"] = versions.is_stranded(row, served)
        return rows

    async def database_now(self) -> float:
        """The database's clock, which judges every lease and deadline (epoch seconds)."""
        await self.open()
        return await self.store.database_now()

    async def served_versions(self) -> dict[str, set[str]]:
        """Workflow name -> the versions its workers serve (see `keel.core.versions`)."""
        await self.open()
        return versions.served_versions(
            await self.store.served_workflows(3 * self.heartbeat_interval)
        )

    async def stranded_runs(self, limit: int = 100) -> list[Row]:
        """Runs that need a worker of a version no worker serves, oldest first."""
        return await self.stranded_runs_of(None, limit)

    async def stranded_runs_of(self, names: list[str] | None, limit: int = 100) -> list[Row]:
        """Stranded runs of workflows `names` (None: all), oldest first (what a worker looks
        for among its own workflows)."""
        served = await self.served_versions()
        names = sorted(served) if names is None else names
        keys = sorted(f"{name}@{v}" for name, vs in served.items() for v in vs)
        rows = await self.store.other_versions(names, keys, limit)
        stranded = [row for row in rows if versions.is_stranded(row, served)]
        for row in stranded:
            row["stranded"] = True
        return stranded

    async def upgrade_run(self, run_id: str, *, to: str, by: str | None = None) -> Row:
        """Move a queued or waiting run to another registered version of its workflow, when
        its checkpoint fits that version's graph; WorkflowVersionMismatch when it does not."""
        await self.open()
        validate_run_id(run_id)
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        workflow = self.workflows.get(run["workflow"], to)
        versions.check_upgradable(run, to)
        graph = workflow.factory().compile(checkpointer=self.fencing())
        problems = await checkpoint_misfits(graph, self.fencing(), run_id)
        if problems:
            raise WorkflowVersionMismatch(
                f"run {run_id} cannot move from {run['workflow']}@{run['workflow_version']} to "
                f"{workflow.key}: its checkpoint does not fit ({'; '.join(problems)})"
            )
        row = await versions.upgrade(self.store, run_id, to, seen=run, by=by)
        self.wake()
        return row

    async def browse_runs(self, **filters: Any) -> list[Row]:
        """Runs newest first (`Store.browse_runs` filters), each with its `pending_waits`."""
        await self.open()
        rows = await self.store.browse_runs(**filters)
        counts = await self.store.count_pending_waits([r["run_id"] for r in rows])
        for row in rows:
            row["pending_waits"] = counts.get(row["run_id"], 0)
        return rows

    async def browse_pending_waits(
        self, *, kind: str | None = None, limit: int = 50, offset: int = 0
    ) -> list[Row]:
        await self.open()
        return await self.store.browse_pending_waits(kind=kind, limit=limit, offset=offset)

    async def running_runs(self, limit: int = 1000) -> list[Row]:
        await self.open()
        return await self.store.running_runs(limit)

    async def get_wait(self, wait_id: str) -> Row:
        await self.open()
        wait = await self.store.get_wait(wait_id)
        if wait is None:
            raise WaitNotFound(f"no wait {wait_id!r}")
        return wait

    async def pending_waits(self, limit: int = 100) -> list[Row]:
        await self.open()
        return await self.store.pending_waits(limit)

    async def workers(self, *, silent_for: float = 0.0) -> list[Row]:
        """Workers that announced themselves within three heartbeat intervals, each with
        `state` "live"; with `silent_for`, also those not stopped that went quiet within that
        many seconds, `state` "silent": waiting for the database, or dead (nobody can tell
        from here; a live one comes back by itself once it reaches the database)."""
        await self.open()
        live_window = 3 * self.heartbeat_interval
        rows = await self.store.workers(max(live_window, silent_for))
        now = await self.store.database_now()
        for row in rows:
            row["state"] = "live" if row["heartbeat_at"] >= now - live_window else "silent"
        return rows

    async def cancel(self, run_id: str, *, by: str | None = None) -> Row:
        await self.open()
        validate_run_id(run_id)
        return await runs.cancel(self.store, run_id, by=by)

    async def resume(self, run_id: str, *, by: str | None = None) -> Row:
        """Queue a failed run again, to continue from its last checkpoint with its ledger."""
        await self.open()
        validate_run_id(run_id)
        row = await failed_runs.resume(self.store, run_id, by=by)
        self.wake()
        return row

    async def decide(self, run_id: str, **kwargs: Any) -> waits.DecisionResult:
        await self.open()
        # A worker of this process with a free slot claims in the decision's commit: the run
        # it queued resumes without waiting for the worker to wake and claim it.
        taker, claim = self._taker()
        if taker is None:
            return await waits.decide(self.services, run_id, **kwargs)
        slot = Reserved(taker)
        try:
            return await waits.decide(self.services, run_id, then=claim, taken=slot.adopt, **kwargs)
        finally:
            slot.give_back()

    async def events_after(self, run_id: str, after: int = 0, limit: int = 500) -> list[Row]:
        """The run's timeline after event id `after` (RunNotFound for an unknown run)."""
        await self.open()
        validate_run_id(run_id)
        rows = await self.store.events_after(run_id, after, limit)
        if not rows and after == 0 and await self.store.get_run(run_id) is None:
            raise RunNotFound(f"no run {run_id!r}")
        return rows

    async def metrics_snapshot(self) -> dict[str, Any]:
        """The database's figures /metrics reports, and `now` by the database's clock."""
        await self.open()
        return await self.store.metrics_snapshot()

    async def run_status(self, run_id: str) -> str:
        """The run's status alone (RunNotFound for an unknown run)."""
        await self.open()
        run = await self.store.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        return str(run["status"])

    async def prune(
        self,
        *,
        older_than: str | float,
        statuses: list[str] | None = None,
        keep_failed: bool = False,
        dry_run: bool = False,
        batch_size: int = 200,
    ) -> retention.PruneReport:
        """Delete finished runs older than `older_than` (see keel.core.retention.prune)."""
        await self.open()
        return await retention.prune(
            self.services,
            older_than=older_than,
            statuses=statuses,
            keep_failed=keep_failed,
            dry_run=dry_run,
            batch_size=batch_size,
        )

    async def approve(self, run_id: str, **kwargs: Any) -> waits.DecisionResult:
        """Approve the run's pending approval; the first decision wins."""
        return await self.decide(run_id, decision="approved", **kwargs)

    async def reject(self, run_id: str, **kwargs: Any) -> waits.DecisionResult:
        """Reject the run's pending approval; the first decision wins."""
        return await self.decide(run_id, decision="rejected", **kwargs)

    async def resolve_effect(
        self, run_id: str, *, performed: bool, result: Any = None, **kwargs: Any
    ) -> waits.DecisionResult:
        """Tell an in-doubt effect's run whether the effect reached the provider."""
        return await self.decide(
            run_id,
            decision="performed" if performed else "not_performed",
            value={"performed": performed, "result": result},
            **kwargs,
        )

    async def end_dead_lease(self, run_id: str, token: int) -> bool:
        """The worker holding `run_id` under `token` is dead (you saw its process exit): let
        the next claim take the run over now instead of after the lease TTL. False if that
        token no longer holds the run."""
        await self.open()
        validate_run_id(run_id)
        return await leases.end_dead(self.store, run_id, token)

    # -- the worker's parts, for a worker and for tests that drive them one by one -------------

    def executor(self, worker_id: str) -> Executor:
        return Executor(self.services, self.workflows, self.fencing(), worker_id)

    async def sweep(self, limit: int = 100) -> int:
        """Apply due reminders, escalations and deadline policies; return how many."""
        await self.open()
        return await sweep_deadlines(self.services, limit)

    async def dispatch(self, worker_id: str, limit: int = 20) -> int:
        """Deliver up to `limit` due notifications; return how many were settled."""
        await self.open()
        return await notification_outbox.dispatch(self.services, worker_id, limit)

    # -- waking workers in this process ------------------------------------------------------

    def add_taker(self, taker: Taker) -> None:
        self._takers.append(taker)  # a worker of this process, until `remove_taker`

    def remove_taker(self, taker: Taker) -> None:
        self._takers.remove(taker)

    def _taker(self) -> tuple[Taker | None, Claim | None]:
        """A worker of this process with a free slot, and its claim, to commit with the next
        admission (keel.runtime.handoff): one commit, not two, and no wait for the worker to
        wake; on SQLite one database-thread call, on PostgreSQL one message."""
        for taker in self._takers:
            claim = taker.reserve()
            if claim is not None:
                return taker, claim
        return None, None

    def waker(self) -> asyncio.Event:
        event = asyncio.Event()
        self._wakers.append(event)
        return event

    def wake(self) -> None:
        for event in self._wakers:
            event.set()


def _effect_timeout(seconds: float | None) -> float:
    """The default timeout of effects that declare none: `seconds`, else $KEEL_EFFECT_TIMEOUT,
    else 60 s."""
    if seconds is None:
        seconds = parse_duration(os.environ.get(EFFECT_TIMEOUT_ENV) or DEFAULT_TIMEOUT)
    if seconds <= 0:
        raise UsageError(f"effect_timeout must be more than zero, not {seconds!r}")
    return float(seconds)
