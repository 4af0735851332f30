"""The Runtime: Keel's async core put together (workflows, connector, services, saver), opened
and closed, with the worker's parts, the wake-ups and the hand-off of fresh runs to a worker of
this process. The operations on runs are `keel.runtime.aio.AsyncApp`'s, over these parts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore

from keel.backends import connect
from keel.core import notification_outbox
from keel.core.clock import LONGEST, Clock, SystemClock, database_override, parse_duration
from keel.core.codec import dumps, loads
from keel.core.deadlines import sweep_deadlines
from keel.core.effects.rows import DEFAULT_TIMEOUT
from keel.core.errors import UsageError
from keel.core.infra import Attempts
from keel.core.notifications import Notifier
from keel.core.portal import Portal
from keel.core.services import Services
from keel.core.store.store import Store
from keel.core.webhooks import WebhookSettings
from keel.core.workflows import Workflow, Workflows
from keel.langgraph.executor import Executor
from keel.langgraph.graphs import compile_graph
from keel.langgraph.inputs import learn_input_schema
from keel.langgraph.savers import FencedSaver, make_saver
from keel.langgraph.shape import describe_change, graph_shape, shape_digest
from keel.langgraph.stores import make_store, setup_store
from keel.runtime.handoff import Claim, Taker
from keel.runtime.records import RunDetails as RunDetails
from keel.runtime.records import Submission as Submission

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
        webhooks: WebhookSettings | None = None,
    ) -> None:
        if not (isinstance(lease_ttl, int | float) and 0 < lease_ttl <= LONGEST):
            # Zero or less: every worker took its own runs over at once, until they failed.
            raise UsageError(f"lease_ttl must be a number of seconds above 0, not {lease_ttl!r}")
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
            webhooks=webhooks or WebhookSettings.configure(),
        )
        self.connector.clock_override = database_override(self.clock)
        self.saver: FencedSaver | None = None
        self._langgraph_store: BaseStore | None = None
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self._wakers: list[asyncio.Event] = []
        self._takers: list[Taker] = []
        self._checked: set[str] = set()
        self.shapes: dict[str, dict[str, Any]] = {}
        """Each checked workflow key's graph structure (keel.langgraph.shape)."""

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
        self._learn(workflow)
        self.workflows.add(workflow)

    def check_workflows(self) -> None:
        """InvalidWorkflow unless every registered graph compiles (once per workflow)."""
        for workflow in self.workflows.all():
            self.check(workflow)

    def check(self, workflow: Workflow) -> None:
        """InvalidWorkflow unless its graph compiles (checked once)."""
        if workflow.key not in self._checked:
            self._learn(workflow)

    def _learn(self, workflow: Workflow) -> None:
        graph = compile_graph(workflow)
        learn_input_schema(workflow, graph)
        self.shapes[workflow.key] = graph_shape(getattr(graph, "builder", graph))
        self._checked.add(workflow.key)

    async def hold_shapes(self, worker_id: str) -> dict[str, str]:
        """Hold each workflow version to the graph structure it was first served with (this
        one, if it is the first): key -> what differs, for each version whose graph here is
        not that one. A worker refuses those versions: a run must not go on in a graph it was
        not built for (a renamed node would end it as completed, its later nodes never run)."""
        refused = {}
        for workflow in self.workflows.all():
            self.check(workflow)
            shape = self.shapes[workflow.key]
            first = await self.store.hold_graph_shape(
                workflow.name, workflow.version, shape_digest(shape), dumps(shape), worker_id
            )
            if first["digest"] != shape_digest(shape):
                refused[workflow.key] = describe_change(loads(first["shape"]), shape)
        return refused

    def adopt(self, workflows: Workflows) -> None:
        """Serve another runtime's registry (shared, not copied) on this one's database."""
        self.workflows = workflows

    def fencing(self) -> FencedSaver:
        """The open runtime's fenced saver."""
        if self.saver is None:
            raise RuntimeError("the runtime is not open")
        return self.saver

    @property
    def langgraph_store(self) -> BaseStore:
        """The open runtime's LangGraph store (keel.langgraph.stores): nodes get it as their
        `store`, the Agent Server's `/store` endpoints read and write it. Named so beside
        `store`, Keel's own."""
        if self._langgraph_store is None:
            raise RuntimeError("the runtime is not open")
        return self._langgraph_store

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
            await self.connector.attach_saver(saver.setup, saver.alone)
            # Made here, on the loop that serves it: upstream batches its calls on that loop.
            store = make_store(self.connector)
            if self.dialect == "sqlite":
                await setup_store(store)  # as the saver's; on PostgreSQL, `migrate` sets it up
            self._langgraph_store = store
            self.saver = saver
            self._opened = True

    async def close(self) -> None:
        await self.connector.close()
        self._langgraph_store = None
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
        await setup_store(make_store(self.connector))
        return applied

    # -- the worker's parts, for a worker and for tests that drive them one by one -------------

    def executor(self, worker_id: str) -> Executor:
        return Executor(
            self.services, self.workflows, self.fencing(), worker_id, store=self.langgraph_store
        )

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

    def taker(self) -> tuple[Taker | None, Claim | None]:
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
