"""Keel's operations on its tables: one implementation over any connector.

Every write a run makes goes through `fenced()`: one transaction that first reads the run's
lease token and raises LeaseLost if another worker has taken the run since. On PostgreSQL the
read is `FOR SHARE`: a takeover's claim skips the row (SKIP LOCKED) while a write holds it and
takes it at a later pass, so no write can commit under a token that was already replaced; on
SQLite the whole transaction runs under BEGIN IMMEDIATE.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from keel.core.codec import dumps, loads
from keel.core.errors import LeaseLost, RunNotFound, SchemaMismatch
from keel.core.store.base import Connector, Row, Tx, load_migrations


@dataclass(frozen=True)
class Lease:
    run_id: str
    worker_id: str
    token: int


class Store:
    def __init__(self, connector: Connector) -> None:
        self.db = connector
        self.migrations = load_migrations(connector.dialect)

    @property
    def dialect(self) -> str:
        return self.db.dialect

    @property
    def latest_version(self) -> int:
        return self.migrations[-1].version

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

    async def migrate(self, now: float, *, target: int | None = None) -> list[str]:
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
                row = await tx.one("schema_version")
                if row and int(row["version"]) >= migration.version:
                    continue
                for statement in migration.statements:
                    await tx.script(statement)
                await tx.execute(
                    "record_migration",
                    {"version": migration.version, "name": migration.name, "now": now},
                )
                applied.append(migration.name)
        return applied

    # -- fencing --------------------------------------------------------------------------------

    @asynccontextmanager
    async def fenced(self, run_id: str, token: int) -> AsyncIterator[Tx]:
        async with self.db.transaction() as tx:
            await self.check_fence(tx, run_id, token)
            yield tx

    async def check_fence(self, tx: Tx, run_id: str, token: int) -> Row:
        row = await tx.one("fence", {"run_id": run_id})
        if row is None:
            raise RunNotFound(f"no run {run_id!r}")
        if int(row["lease_token"]) != token:
            raise LeaseLost(
                f"run {run_id}: lease token {token} is stale (current {row['lease_token']}, "
                f"owner {row['lease_owner']})"
            )
        return row

    # -- events ----------------------------------------------------------------------------------

    @staticmethod
    async def add_event(
        tx: Tx,
        run_id: str,
        kind: str,
        now: float,
        data: dict[str, Any] | None = None,
        *,
        worker_id: str | None = None,
        token: int | None = None,
    ) -> None:
        await tx.execute(
            "insert_event",
            {
                "run_id": run_id,
                "now": now,
                "kind": kind,
                "worker_id": worker_id,
                "lease_token": token,
                "data": dumps(data or {}),
            },
        )

    async def events(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            rows = await tx.all("list_events", {"run_id": run_id})
        for row in rows:
            row["data"] = loads(row["data"])
        return rows

    # -- runs ------------------------------------------------------------------------------------

    async def get_run(self, run_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await tx.one("get_run", {"run_id": run_id})

    async def list_runs(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        job_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Row]:
        params = {
            "status": status,
            "workflow": workflow,
            "job_id": job_id,
            "limit": limit,
            "offset": offset,
        }
        async with self.db.read() as tx:
            return await tx.all("list_runs", params)

    async def effects(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_effects", {"run_id": run_id})

    async def intents(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_intents", {"run_id": run_id})

    async def waits(self, run_id: str) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_waits", {"run_id": run_id})

    async def pending_waits(self, limit: int = 100) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_pending_waits", {"limit": limit})

    async def get_wait(self, wait_id: str) -> Row | None:
        async with self.db.read() as tx:
            return await tx.one("get_wait", {"wait_id": wait_id})

    async def count_unfinished(self, workflows: list[str]) -> int:
        async with self.db.read() as tx:
            row = await tx.one("count_unfinished", {"workflows": json.dumps(workflows)})
        return int(row["n"]) if row else 0

    async def workers(self, since: float) -> list[Row]:
        async with self.db.read() as tx:
            return await tx.all("list_workers", {"since": since})
