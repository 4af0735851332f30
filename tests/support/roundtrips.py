"""Counting what reaches the database, at the driver: PostgreSQL round trips and SQLite calls.

PostgreSQL: every exchange psycopg has with the server (a statement, BEGIN, COMMIT, a pipeline
sync, the pool's check of a connection at checkout) is a generator driven by
`AsyncConnection.wait` that waits to read the server's answer; one that never waits to read (a
COMMIT with no transaction open, a pipeline's flush) sent nothing to answer, and a LISTEN
connection waiting for notifications is not an exchange: neither is counted. The pool's
checks are counted apart (`checks`), so a test can say what its own statements cost.

SQLite: every hand-off to aiosqlite's database thread (a statement, a fetch, a commit, or one
whole `Connector.single` chain) goes through `Connection._execute`; a transaction the connector
runs on the event loop's own thread instead (`SqliteConnector._here`) is counted as `here`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiosqlite
import psycopg
from psycopg.waiting import WAIT_R

from keel.backends.sqlite import SqliteConnector


@dataclass
class Count:
    trips: int = 0
    """PostgreSQL round trips (pool checks included) or SQLite database-thread calls."""
    checks: int = 0
    """Of those, the pool's checks of a connection at checkout (PostgreSQL)."""
    kinds: list[str] = field(default_factory=list)

    @property
    def statements(self) -> int:
        """Round trips Keel's own code made (the pool's checks left out)."""
        return self.trips - self.checks

    def reset(self) -> None:
        self.trips, self.checks = 0, 0
        self.kinds.clear()


def _in_pool_check() -> bool:
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        # The pool's own upkeep, not the caller's: its check of a connection at checkout, and
        # the setup of a connection it opened (in the background, whenever it likes).
        if frame.f_code.co_name in ("check_connection", "_configure"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _watch(gen: Any, read: list[bool]) -> Any:
    """`gen` as psycopg drives it, noting whether it waited to read from the server."""
    try:
        state = next(gen)
    except StopIteration as done:
        return done.value
    while True:
        # Waiting to read alone is waiting for the server's answer. A pipeline's send waits
        # to read *or* write (it takes whatever results are already there, and goes on
        # sending): no answer is awaited, and its statements' round trip is the Sync's.
        read[0] = read[0] or state == WAIT_R
        ready = yield state
        try:
            state = gen.send(ready)
        except StopIteration as done:
            return done.value


@contextmanager
def counting() -> Iterator[Count]:
    """Count, in this process, until the block ends."""
    count = Count()
    pg_wait = psycopg.AsyncConnection.wait
    sqlite_execute = aiosqlite.Connection._execute
    sqlite_here = SqliteConnector._here

    async def wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(gen, "__name__", "")
        if name == "notifies":
            return await pg_wait(self, gen, *args, **kwargs)
        check = _in_pool_check()
        read = [False]
        result = await pg_wait(self, _watch(gen, read), *args, **kwargs)
        if read[0]:
            count.trips += 1
            count.checks += check
            count.kinds.append("check" if check else name)
        return result

    async def execute(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        count.trips += 1
        count.kinds.append(getattr(fn, "__name__", repr(fn)))
        return await sqlite_execute(self, fn, *args, **kwargs)

    def here(self: SqliteConnector, conn: Any) -> bool:
        began = sqlite_here(self, conn)
        if began:
            count.trips += 1
            count.kinds.append("here")
        return began

    psycopg.AsyncConnection.wait = wait  # type: ignore[method-assign]
    aiosqlite.Connection._execute = execute  # type: ignore[method-assign]
    SqliteConnector._here = here  # type: ignore[method-assign]
    try:
        yield count
    finally:
        psycopg.AsyncConnection.wait = pg_wait  # type: ignore[method-assign]
        aiosqlite.Connection._execute = sqlite_execute  # type: ignore[method-assign]
        SqliteConnector._here = sqlite_here  # type: ignore[method-assign]
