"""LangGraph's own long-term memory stores (`BaseStore`) on Keel's database: what nodes reach as
their `store` parameter or through `get_store()`, and what the Agent Server's `/store` endpoints
read and write.

Upstream's `AsyncSqliteStore` and `AsyncPostgresStore` decide every statement; Keel only hands
them its connections. On SQLite the store shares Keel's one connection, so it takes the
connector's lock around each of its transactions (as the checkpoint saver does): none of Keel's
transactions interleaves with one of the store's. On PostgreSQL it draws connections from Keel's
pool (autocommit, dict rows: what upstream expects).

A store write is not fenced: a node that writes to the store and is executed again after a
crash writes again (a put is idempotent by namespace and key; anything else a node derives from
what it read may differ). Writes that must happen once belong in `@keel.effect`.
"""

from __future__ import annotations

import asyncio

from langgraph.store.base import BaseStore
from langgraph.store.postgres.aio import AsyncPostgresStore
from langgraph.store.sqlite.aio import AsyncSqliteStore

from keel.backends.postgres import PostgresConnector
from keel.backends.sqlite import SqliteConnector
from keel.core.store.base import Connector

SETUP_TRIES = 5


class KeelSqliteStore(AsyncSqliteStore):
    """AsyncSqliteStore on Keel's connection, under Keel's lock."""

    def __init__(self, connector: SqliteConnector) -> None:
        super().__init__(connector.connection)
        # Keel's lock in place of upstream's own: Keel's transactions and the store's take
        # turns on the one connection (upstream only uses `async with self.lock`).
        self.lock = connector.lock  # type: ignore[assignment]

    async def setup(self) -> None:
        async with self.lock:
            try:
                await super().setup()
            except BaseException:
                # Another process set up the same tables at once: leave the connection as
                # found, for the next try (`setup_store`) and for Keel's transactions.
                if self.conn.in_transaction:
                    await self.conn.rollback()
                raise
            # Upstream expects an autocommit connection; on Keel's, its migration's INSERT
            # opened a transaction that the next BEGIN would trip on.
            if self.conn.in_transaction:
                await self.conn.commit()


def make_store(connector: Connector) -> BaseStore:
    """LangGraph's store for the connector's database, on its connections. Made on the event
    loop that will serve it (upstream's batching task lives there)."""
    if isinstance(connector, SqliteConnector):
        return KeelSqliteStore(connector)
    if isinstance(connector, PostgresConnector):
        return AsyncPostgresStore(connector.pool)
    raise TypeError(f"no LangGraph store for {type(connector).__name__}")


async def setup_store(store: BaseStore) -> None:
    """Create the store's tables if they are not there yet (idempotent)."""
    if not isinstance(store, AsyncSqliteStore | AsyncPostgresStore):
        return
    for attempt in range(1, SETUP_TRIES + 1):
        try:
            await store.setup()
            return
        except Exception:
            # Two processes setting up at once both create the same tables and record the same
            # version: the next try sees what the other one made.
            if attempt == SETUP_TRIES:
                raise
            await asyncio.sleep(0.05 * attempt)
