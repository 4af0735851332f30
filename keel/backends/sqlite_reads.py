"""LangGraph's reads on SQLite, at one call to the database thread per statement.

aiosqlite's cursor costs a call to open it, one to execute, one per fetch and one to close:
four thread hand-offs (each a thread switch and an event-loop wake-up) for a checkpoint that
is not there. The saver's reads go through `ThreadCursor` instead (keel.langgraph.savers).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import aiosqlite

CHUNK = 64
"""Rows a read fetches per call to the database thread (aiosqlite's own iteration chunk)."""


class ThreadCursor:
    """aiosqlite's cursor as LangGraph's saver uses it for its reads, at one call to the
    database thread per statement: `execute` runs the statement and fetches its first rows in
    the same call (aiosqlite's costs one call to open the cursor, one to execute, one per fetch
    and one to close). Longer results come `CHUNK` rows per call, so a long history is never
    held whole."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._cursor: sqlite3.Cursor | None = None
        self._rows: list[Any] = []
        self._more = False
        self.rowcount = -1
        self.lastrowid: int | None = None
        self.description: Any = None

    async def execute(self, sql: str, parameters: Any = None) -> ThreadCursor:
        await self._finish()
        conn = self._conn

        def read() -> tuple[sqlite3.Cursor, list[Any]]:
            cur = conn._conn.execute(sql, () if parameters is None else parameters)
            return cur, _first_rows(cur)

        cur, rows = await conn._execute(read)
        self._settle(cur, rows)
        return self

    async def executemany(self, sql: str, parameters: Any) -> ThreadCursor:
        await self._finish()
        conn = self._conn

        def write() -> tuple[sqlite3.Cursor, list[Any]]:
            cur = conn._conn.executemany(sql, parameters)
            return cur, _first_rows(cur)

        cur, rows = await conn._execute(write)
        self._settle(cur, rows)
        return self

    def _settle(self, cur: sqlite3.Cursor, rows: list[Any]) -> None:
        self._cursor, self._rows, self._more = cur, rows, len(rows) == CHUNK
        self.rowcount, self.lastrowid = cur.rowcount, cur.lastrowid
        self.description = cur.description

    async def _next_chunk(self) -> None:
        cur = self._cursor
        if cur is None or not self._more:
            return
        self._rows = await self._conn._execute(_first_rows, cur)
        self._more = len(self._rows) == CHUNK

    async def fetchone(self) -> Any:
        if not self._rows:
            await self._next_chunk()
        return self._rows.pop(0) if self._rows else None

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        want = CHUNK if size is None else size
        got: list[Any] = []
        while len(got) < want:
            if not self._rows:
                await self._next_chunk()
                if not self._rows:
                    break
            take = want - len(got)
            got += self._rows[:take]
            del self._rows[:take]
        return got

    async def fetchall(self) -> list[Any]:
        got, self._rows = self._rows, []
        if self._more and self._cursor is not None:
            got += await self._conn._execute(self._cursor.fetchall)
            self._more = False
        self._cursor = None
        return got

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            row = await self.fetchone()
            if row is None:
                return
            yield row

    async def _finish(self) -> None:
        # A result read only partly keeps its statement open on the shared connection (and
        # SQLite's read snapshot with it): reset it on the thread, where sqlite3 allows it.
        cur, self._cursor, self._rows = self._cursor, None, []
        if cur is not None and self._more:
            self._more = False
            await self._conn._execute(cur.close)

    async def close(self) -> None:
        await self._finish()

    def __await__(self) -> Any:  # `await conn.cursor()`, as aiosqlite allows
        return self.__aenter__().__await__()

    async def __aenter__(self) -> ThreadCursor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._finish()


def _first_rows(cur: sqlite3.Cursor) -> list[Any]:
    rows = cur.fetchmany(CHUNK) if cur.description is not None else []
    if len(rows) < CHUNK:
        cur.close()
    return rows


class ThreadQuery:
    """`conn.execute(sql, params)` as aiosqlite answers it (awaitable, and an async context
    manager that closes the cursor), through a `ThreadCursor`."""

    def __init__(self, conn: aiosqlite.Connection, sql: str, parameters: Any) -> None:
        self._cursor = ThreadCursor(conn)
        self._sql, self._parameters = sql, parameters

    def __await__(self) -> Any:
        return self._cursor.execute(self._sql, self._parameters).__await__()

    async def __aenter__(self) -> ThreadCursor:
        return await self._cursor.execute(self._sql, self._parameters)

    async def __aexit__(self, *exc: object) -> None:
        await self._cursor.close()
