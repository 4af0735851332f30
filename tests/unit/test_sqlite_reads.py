"""LangGraph's reads on SQLite (`ThreadCursor`): one call to the database thread per
statement with its first rows, further rows a chunk per call, every row once and in order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiosqlite

from keel.backends.sqlite_reads import CHUNK, ThreadCursor, ThreadQuery
from tests.support.roundtrips import counting

T = TypeVar("T")
N = 2 * CHUNK + 22


def _with_table(body: Callable[[aiosqlite.Connection], Awaitable[T]]) -> T:
    async def go() -> T:
        conn = await aiosqlite.connect(":memory:")
        try:
            await conn.execute("CREATE TABLE t (i INTEGER PRIMARY KEY)")
            await conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(N)])
            await conn.commit()
            return await body(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def test_a_long_result_comes_a_chunk_per_call_every_row_once() -> None:
    async def body(conn: aiosqlite.Connection) -> tuple[list[Any], int]:
        with counting() as count:
            async with ThreadQuery(conn, "SELECT i FROM t ORDER BY i", None) as cur:
                got = [row[0] async for row in cur]
        return got, count.trips

    got, trips = _with_table(body)
    assert got == list(range(N))
    assert trips == 3  # the statement with its first chunk, then two more chunks


def test_a_short_result_is_one_call_and_fetches_mix() -> None:
    async def body(conn: aiosqlite.Connection) -> tuple[Any, ...]:
        with counting() as count:
            async with ThreadCursor(conn) as cur:
                await cur.execute("SELECT i FROM t WHERE i < ? ORDER BY i", (5,))
                first = await cur.fetchone()
                two = await cur.fetchmany(2)
                rest = await cur.fetchall()
                after = await cur.fetchone()
        return first, two, rest, after, count.trips

    first, two, rest, after, trips = _with_table(body)
    assert (first[0], [r[0] for r in two], [r[0] for r in rest], after) == (0, [1, 2], [3, 4], None)
    assert trips == 1


def test_a_partly_read_result_is_closed_and_the_cursor_reused() -> None:
    async def body(conn: aiosqlite.Connection) -> tuple[Any, ...]:
        cur = await ThreadCursor(conn)
        await cur.execute("SELECT i FROM t ORDER BY i")
        head = await cur.fetchmany(3)
        await cur.execute("SELECT COUNT(*) FROM t WHERE i >= ?", (CHUNK,))
        (n,) = await cur.fetchone()
        await cur.close()
        await conn.execute("DELETE FROM t")  # nothing left open holds the table
        await conn.commit()
        return [r[0] for r in head], n

    assert _with_table(body) == ([0, 1, 2], N - CHUNK)
