"""The SQLite connector's transactions: `SqliteTx`, whose statements each go to aiosqlite's
database thread from the event loop, and `ThreadTx`, whose statements run where it is (the
database thread, or the loop's own, in `SqliteConnector.run_transaction`); and what a SQLite
error means for a retry."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiosqlite

from keel.core.faults import statement_fails
from keel.core.store.base import Later, Params, Row, Statement

T = TypeVar("T")

# Primary result codes of a file that is busy, locked, full or failing, not of a bad statement.
_TRANSIENT_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def is_transient(exc: BaseException) -> bool:
    """The database file was busy, full or unreadable: retrying later can succeed."""
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _TRANSIENT_CODES  # extended codes carry the primary in the low byte
    text = str(exc).lower()
    return any(s in text for s in ("locked", "busy", "disk is full", "disk i/o error"))


def injected_failure() -> None:
    # SQLite has no server to drop the connection: a `fail-next-statement` fault (keel chaos
    # --fault db-error) fails the statement here as a lost file or full disk would.
    if statement_fails():
        raise sqlite3.OperationalError("disk I/O error (injected by keel chaos --fault db-error)")


_CHAIN_SPLIT = re.compile(r";[ \t]*$", re.MULTILINE)


def _run_chain(
    conn: sqlite3.Connection, chain: tuple[str, ...], params: Params | None, *, own: bool
) -> Row | None:
    """A chain of statements (see `Connector.single`) on the database thread, in a transaction
    of its own (`own`) or in the one already open on `conn`."""
    bound = dict(params or {})
    answer: Row = {}
    if own:
        conn.execute("BEGIN IMMEDIATE")
    try:
        for sql in chain:
            cur = conn.execute(sql, bound)
            if cur.description is None:
                continue
            rows = cur.fetchall()
            if not rows:
                answer = {}
                break
            answer.update(dict(rows[0]))
            bound.update(answer)
        if own:
            conn.commit()
    except BaseException:
        if own:
            conn.rollback()
        raise
    return answer or None


def split_chain(sql: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in _CHAIN_SPLIT.split(sql) if s.strip())


class SqliteTx:
    """Named queries from the event loop: each statement, with its fetch, is one call to the
    database thread (aiosqlite's public calls cost one per statement, fetch and close)."""

    pipelined = False  # `send` runs its statement at once

    def __init__(
        self,
        conn: aiosqlite.Connection,
        queries: dict[str, str],
        chains: dict[str, tuple[str, ...]],
    ) -> None:
        self.connection = conn
        self._queries = queries
        self._chains = chains

    async def _on_thread(self, method: str, *args: Any) -> Any:
        conn = self.connection

        def statement() -> Any:
            tx = ThreadTx(conn._conn, self._queries, self._chains)
            return run_to_end(getattr(tx, method)(*args))

        return await conn._execute(statement)

    async def one(self, name: str, params: Params | None = None) -> Row | None:
        injected_failure()
        row: Row | None = await self._on_thread("one", name, params)
        return row

    async def all(self, name: str, params: Params | None = None) -> list[Row]:
        injected_failure()
        rows: list[Row] = await self._on_thread("all", name, params)
        return rows

    async def execute(self, name: str, params: Params | None = None) -> int:
        injected_failure()
        count: int = await self._on_thread("execute", name, params)
        return count

    async def script(self, sql: str) -> None:
        await self._on_thread("script", sql)

    async def send(self, name: str, params: Params | None = None) -> Later:
        row = await self.one(name, params)
        return _now(row)

    async def replay(self, statement: Statement) -> None:
        await self._on_thread("replay", statement)


def _now(row: Row | None) -> Later:
    async def later() -> Row | None:
        return row

    return later


class ThreadTx:
    """Named queries on the database thread itself, inside `SqliteConnector.run_transaction`.

    Its methods are coroutines that never suspend (sqlite3 is synchronous here), so the store's
    own async methods run on the thread unchanged: one implementation of each query, no hop
    per statement."""

    pipelined = False

    def __init__(
        self, conn: sqlite3.Connection, queries: dict[str, str], chains: dict[str, tuple[str, ...]]
    ) -> None:
        self.connection = conn
        self._queries = queries
        self._chains = chains

    async def one(self, name: str, params: Params | None = None) -> Row | None:
        injected_failure()
        chain = self._chains[name]
        if len(chain) > 1:
            return _run_chain(self.connection, chain, params, own=False)
        cur = self.connection.execute(self._queries[name], params or {})
        try:
            row = cur.fetchone()
        finally:
            cur.close()
        return dict(row) if row is not None else None

    async def all(self, name: str, params: Params | None = None) -> list[Row]:
        injected_failure()
        rows = self.connection.execute(self._queries[name], params or {}).fetchall()
        return [dict(r) for r in rows]

    async def execute(self, name: str, params: Params | None = None) -> int:
        injected_failure()
        return self.connection.execute(self._queries[name], params or {}).rowcount

    async def script(self, sql: str) -> None:
        self.connection.execute(sql)

    async def send(self, name: str, params: Params | None = None) -> Later:
        return _now(await self.one(name, params))

    async def replay(self, statement: Statement) -> None:
        injected_failure()
        sql, params, many = statement
        if many:
            self.connection.executemany(sql, params)
        else:
            self.connection.execute(sql, params)


def run_to_end(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that awaits only ThreadTx statements, here, to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(
        "a statement of a database-thread transaction awaited something else than its Tx"
    )
