"""Keel's operations on its tables: one implementation over any connector.

`Store` is the only code that names queries: one method per query (or per small group that is
one step of a transaction). Methods that take a `tx` first run inside the caller's transaction,
opened with `transaction()`, `read()` or `fenced()`; the others open their own read. The methods
are grouped by table in the `*_queries` modules and combined here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

from keel.core import infra
from keel.core.errors import SchemaMismatch
from keel.core.store.assistant_queries import AssistantQueries
from keel.core.store.base import Connector, T, Tx, load_migrations, load_moves
from keel.core.store.chunk_queries import ChunkQueries
from keel.core.store.effect_queries import EffectQueries
from keel.core.store.intent_queries import IntentQueries
from keel.core.store.lease_queries import LeaseQueries
from keel.core.store.notification_queries import NotificationQueries
from keel.core.store.ops_queries import OpsQueries
from keel.core.store.run_queries import RunQueries, committed
from keel.core.store.schedule_queries import ScheduleQueries
from keel.core.store.thread_queries import ThreadQueries
from keel.core.store.wait_queries import WaitQueries
from keel.core.store.webhook_queries import WebhookQueries


@dataclass(frozen=True)
class Lease:
    run_id: str
    worker_id: str
    token: int


class Store(
    RunQueries,
    LeaseQueries,
    WaitQueries,
    EffectQueries,
    IntentQueries,
    NotificationQueries,
    OpsQueries,
    ThreadQueries,
    AssistantQueries,
    ChunkQueries,
    ScheduleQueries,
    WebhookQueries,
):
    def __init__(self, connector: Connector) -> None:
        self.db = connector
        self.migrations = load_migrations(connector.dialect)
        self.moves = load_moves(connector.dialect)

    @property
    def dialect(self) -> str:
        return self.db.dialect

    @property
    def latest_version(self) -> int:
        return self.migrations[-1].version

    def is_infrastructure(self, exc: BaseException) -> bool:
        """Did `exc` come from the database or the machine rather than the graph (the one rule,
        in `keel.core.infra`, fed by this backend's driver errors)?"""
        return infra.is_infrastructure(exc, self.db.is_transient)

    def is_keel_fault(self, exc: BaseException) -> bool:
        """An infrastructure fault of a call Keel made, not of one the graph's own code made
        (a node's own database): what decides for an error raised out of the graph."""
        return infra.is_keel_fault(exc, self.db.is_transient)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        """A write transaction (SQLite: the write lock is taken at its start). The timeline
        events it adds are logged once it has committed."""
        with committed():
            async with self.db.transaction() as tx:
                yield tx

    def read(self) -> AbstractAsyncContextManager[Tx]:
        return self.db.read()

    async def step_transaction(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """A write transaction as one call to the database (`Connector.run_transaction`): a
        step's fence, events and checkpoint. Its timeline events are logged once it commits."""
        with committed():
            return await self.db.run_transaction(body)

    # -- the database's clock ----------------------------------------------------------------

    @staticmethod
    async def db_now(tx: Tx) -> float:
        """The database's time (epoch seconds): what leases and deadlines are judged by."""
        row = await tx.one("database_now")
        assert row is not None
        return float(row["now"])

    async def database_now(self) -> float:
        async with self.db.read() as tx:
            return await self.db_now(tx)

    # -- schema -------------------------------------------------------------------------------

    async def schema_version(self) -> int:
        async with self.db.read() as tx:
            row = await tx.one("schema_table_exists")
            if not row or not row["n"]:
                return 0
            version = await tx.one("schema_version")
        return int(version["version"]) if version else 0

    async def check_schema(self) -> None:
        current = await self.schema_version()
        if current != self.latest_version:
            direction = "older" if current < self.latest_version else "newer"
            hint = (
                "run `keel migrate`"
                if current < self.latest_version
                else "upgrade Keel on this machine"
            )
            raise SchemaMismatch(
                f"the database schema is at version {current}, {direction} than version "
                f"{self.latest_version} that this Keel needs: {hint}"
            )

    async def migrate(self, *, target: int | None = None) -> list[str]:
        """Apply pending migrations, each in its own locked transaction; return their names."""
        applied: list[str] = []
        async with self.db.transaction() as tx:
            await tx.one("migration_lock")
            await tx.execute("create_schema_table")
        for migration in self.migrations:
            if target is not None and migration.version > target:
                break
            async with self.db.transaction() as tx:
                await tx.one("migration_lock")
                applied_versions = {int(r["version"]) for r in await tx.all("applied_migrations")}
                if migration.version in applied_versions:
                    continue
                for statement in migration.statements:
                    await tx.script(statement)
                await tx.execute(
                    "record_migration",
                    {"version": migration.version, "name": migration.name},
                )
                applied.append(migration.name)
        return applied
