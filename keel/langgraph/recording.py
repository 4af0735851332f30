"""Upstream's statements, captured instead of run: while Keel's saver calls upstream's
`aput` / `aput_writes`, its connection (SQLite) or cursor (PostgreSQL) records what it would
have executed, and Keel replays it inside its own step transaction (keel.langgraph.savers)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import aiosqlite

from keel.backends.locks import TaskReentrantLock
from keel.backends.pg_batch import LARGE
from keel.backends.sqlite_reads import ThreadCursor, ThreadQuery
from keel.core.portal import hop_inline
from keel.core.store.base import Statement

recording: ContextVar[list[Statement] | None] = ContextVar("keel_recording", default=None)
"""The statements of the upstream call running in this context, or None when none records."""


@contextmanager
def recorded(recorder: list[Statement], *, inline: bool = False) -> Iterator[None]:
    """Record, rather than run, what upstream's saver issues in this block; with `inline`, what
    it hands to a thread to serialize runs at once instead (keel.core.portal.LoopThreads)."""
    reset = recording.set(recorder)
    hop = hop_inline.set(True) if inline else None
    try:
        yield
    finally:
        if hop is not None:
            hop_inline.reset(hop)
        recording.reset(reset)


# -- recorders: upstream's statements, captured instead of run ----------------------------------


class Recorder:
    """A cursor that keeps the statements it is given (upstream's aput and aput_writes)."""

    def __init__(self, into: list[Statement]) -> None:
        self._into = into

    async def execute(self, sql: str, params: Any = None) -> None:
        self._into.append((sql, params, False))

    async def executemany(self, sql: str, params: Any) -> None:
        self._into.append((sql, list(params), True))

    async def __aenter__(self) -> Recorder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class Recording:
    """What `conn.execute(...)` / `conn.cursor()` return while recording: awaitable, and an
    async context manager, as aiosqlite's results are."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def __await__(self) -> Any:
        return self._recorder.__aenter__().__await__()

    async def __aenter__(self) -> Recorder:
        return self._recorder

    async def __aexit__(self, *exc: object) -> None:
        return None


class SqliteConnection:
    """The aiosqlite connection as upstream's saver sees it: its writes are recorded (and its
    commit is Keel's); its reads run at one database-thread call per statement (`ThreadCursor`);
    anything else goes to the connection itself."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Any = None) -> Any:
        into = recording.get()
        if into is None:
            return ThreadQuery(self._conn, sql, params)
        recorder = Recorder(into)
        into.append((sql, params, False))
        return Recording(recorder)

    def cursor(self) -> Any:
        into = recording.get()
        return ThreadCursor(self._conn) if into is None else Recording(Recorder(into))

    async def commit(self) -> None:
        if recording.get() is None:
            await self._conn.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class SqliteLock:
    """The connector's lock, except while upstream only records: then it touches nothing."""

    def __init__(self, lock: TaskReentrantLock) -> None:
        self.inner = lock

    async def __aenter__(self) -> None:
        if recording.get() is None:
            await self.inner.acquire()

    async def __aexit__(self, *exc: object) -> None:
        if recording.get() is None:
            self.inner.release()

    def locked(self) -> bool:
        return self.inner.locked()


# -- small values, serialized without upstream's thread ------------------------------------------

WALK = 512
"""Values a look at a state's size goes through before it calls the state large."""


def small_state(values: Iterable[Any]) -> bool:
    """Whether values (a checkpoint's channels, a task's writes) hold under `pg_batch.LARGE`
    bytes of strings and bytes, as a bounded walk through their containers (and objects'
    attributes: a message's) can tell. Anything it cannot look into (an array, a walk past
    `WALK` values) counts as large.

    Upstream's PostgreSQL saver serializes blob values and writes in a thread
    (`asyncio.to_thread`); what Keel records for a small state it serializes on the loop
    instead (`recorded(..., inline=True)`). The step's commit waits for those statements, and
    on a loop busy with other runs the hop, not the microseconds msgpack takes, was nearly all
    of the wait."""
    stack = list(values)
    budget, steps = LARGE, 0
    while stack:
        steps += 1
        if steps > WALK:
            return False
        value = stack.pop()
        kind = type(value)
        if kind is str or kind is bytes or kind is bytearray:
            budget -= len(value)
            if budget < 0:
                return False
        elif value is None or kind is int or kind is float or kind is bool:
            continue
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list | tuple | set | frozenset):
            stack.extend(value)
        elif isinstance(value, str | bytes | int | float):  # a subclass: an enum, a str type
            budget -= len(str(value))
            if budget < 0:
                return False
        else:
            attributes = getattr(value, "__dict__", None)
            if not isinstance(attributes, dict):
                return False
            stack.extend(attributes.values())
    return True
