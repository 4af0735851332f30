"""Keel's async core: registered workflows, the store, the saver, and the operations on runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keel import runs, waits
from keel.artifacts import RunArtifacts
from keel.clock import Clock, SystemClock
from keel.errors import RunNotFound, UnknownWorkflow, UsageError, WaitNotFound
from keel.ids import validate_run_id
from keel.outbox import Notifier
from keel.portal import Portal
from keel.store.base import Connector, Row
from keel.store.store import Store, loads

DEFAULT_URL = "sqlite:///.keel/keel.db"
DURABILITIES = ("sync", "async", "exit")


@dataclass(frozen=True)
class Workflow:
    name: str
    version: str
    factory: Callable[[], Any]
    durability: str = "sync"
    termination: Callable[[Any], str | None] | None = None
    recursion_limit: int = 100
    max_concurrency: int | None = None
    """At most this many runs of this workflow execute at once, across all workers."""

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass
class Workflows:
    _by_key: dict[str, Workflow] = field(default_factory=dict)
    _latest: dict[str, Workflow] = field(default_factory=dict)

    def add(self, workflow: Workflow) -> None:
        if workflow.durability not in DURABILITIES:
            raise UsageError(f"durability must be one of {DURABILITIES}")
        self._by_key[workflow.key] = workflow
        self._latest[workflow.name] = workflow

    def get(self, name: str, version: str | None = None) -> Workflow:
        found = self._latest.get(name) if version is None else self._by_key.get(f"{name}@{version}")
        if found is None:
            known = ", ".join(sorted(self._by_key)) or "none"
            what = name if version is None else f"{name}@{version}"
            raise UnknownWorkflow(f"no workflow {what!r} is registered (registered: {known})")
        return found

    def keys(self) -> list[str]:
        return sorted(self._by_key)

    def limits(self) -> dict[str, int]:
        return {k: w.max_concurrency for k, w in self._by_key.items() if w.max_concurrency}


def connect(url: str) -> Connector:
    if url.startswith("sqlite:"):
        from keel.store.sqlite import SqliteConnector

        return SqliteConnector(url)
    if url.startswith(("postgresql:", "postgres:", "postgresql+psycopg:")):
        from keel.store.postgres import PostgresConnector

        return PostgresConnector(url)
    raise UsageError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")


@dataclass
class RunDetails:
    """Everything Keel knows about one run."""

    run: Row
    timeline: list[Row]
    effects: list[Row]
    waits: list[Row]
    artifacts: list[Any]
    notifications: list[Row] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.run["status"])

    @property
    def decision(self) -> str:
        return str(self.run["decision"])

    @property
    def termination_reason(self) -> str | None:
        return self.run["termination_reason"]

    @property
    def output(self) -> Any:
        return loads(self.run["output"])


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
    ) -> None:
        self.url = url
        self.clock: Clock = clock or SystemClock()
        self.artifacts_root = Path(artifacts_root)
        self.lease_ttl = lease_ttl
        self.heartbeat_interval = heartbeat_interval or lease_ttl / 3
        self.max_input_bytes = max_input_bytes
        self.portal = portal or Portal()
        self.workflows = Workflows()
        self.notifiers: dict[str, Notifier] = {}
        self.connector = connect(url)
        self.store = Store(self.connector)
        self.saver: Any = None
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self._wakers: list[asyncio.Event] = []

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
            saver = self.connector.checkpointer()
            saver.bind(self.store, self.clock)
            if self.store.dialect == "sqlite":
                await saver.setup()  # idempotent; its lazy setup would commit our transactions
            self.saver = saver
            self._opened = True

    async def close(self) -> None:
        await self.connector.close()
        self._opened = False

    async def migrate(self) -> list[str]:
        await self.connector.open()
        applied = await self.store.migrate(self.clock.now())
        saver = self.connector.checkpointer()
        saver.bind(self.store, self.clock)
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
    ) -> tuple[Row, bool]:
        await self.open()
        wf = self.workflows.get(workflow, version)
        row, created = await runs.admit(
            self.store,
            workflow=wf.name,
            version=wf.version,
            job_id=job_id,
            input=input,
            now=self.clock.now(),
            rerun=rerun,
            max_input_bytes=self.max_input_bytes,
        )
        if created:
            self.wake()
        return row, created

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
        )

    async def list_runs(self, **filters: Any) -> list[Row]:
        await self.open()
        return await self.store.list_runs(**filters)

    async def get_wait(self, wait_id: str) -> Row:
        await self.open()
        wait = await self.store.get_wait(wait_id)
        if wait is None:
            raise WaitNotFound(f"no wait {wait_id!r}")
        return wait

    async def pending_waits(self, limit: int = 100) -> list[Row]:
        await self.open()
        return await self.store.pending_waits(limit)

    async def workers(self) -> list[Row]:
        """Workers that announced themselves within three heartbeat intervals."""
        await self.open()
        return await self.store.workers(self.clock.now() - 3 * self.heartbeat_interval)

    async def cancel(self, run_id: str, *, by: str | None = None) -> Row:
        await self.open()
        validate_run_id(run_id)
        return await runs.cancel(self.store, run_id, self.clock.now(), by=by)

    async def decide(self, run_id: str, **kwargs: Any) -> waits.DecisionResult:
        await self.open()
        return await waits.decide(self, run_id, **kwargs)

    # -- waking workers in this process ------------------------------------------------------

    def waker(self) -> asyncio.Event:
        event = asyncio.Event()
        self._wakers.append(event)
        return event

    def wake(self) -> None:
        for event in self._wakers:
            event.set()
