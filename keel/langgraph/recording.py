"""Upstream's statements, captured instead of run: while Keel's saver calls upstream's
`aput` / `aput_writes`, its connection (SQLite) or cursor (PostgreSQL) records what it would
have executed, and Keel replays it inside its own step transaction (keel.langgraph.savers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from keel.backends.locks import TaskReentrantLock
from keel.backends.sqlite_reads import ThreadCursor, ThreadQuery
from keel.core.store.base import Statement

recording: ContextVar[list[Statement] | None] = ContextVar("keel_recording", default=None)
"""The statements of the upstream call running in this context, or None when none records."""


@contextmanager
def recorded(recorder: list[Statement]) -> Iterator[None]:
    """Record, rather than run, what upstream's saver issues in this block."""
    reset = recording.set(recorder)
    try:
        yield
    finally:
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


# -- small writes, recorded without upstream's thread -------------------------------------------

SMALL = 1024
"""Characters or bytes past which a string value is left to upstream's thread to serialize."""


def _small(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float):
        return True
    return isinstance(value, str | bytes) and len(value) <= SMALL


def small_writes(
    saver: AsyncPostgresSaver,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> list[Statement] | None:
    """What upstream's `AsyncPostgresSaver.aput_writes` issues for a task's writes if they are
    all small (scalars, short strings: a counter, a branch's None), else None. Upstream hops to
    a thread to serialize them; the step's `aput` waits for these statements, and on a busy
    event loop that hop, not the microseconds msgpack takes, was nearly all of the wait.
    tests/conformance/test_upstream_statements.py holds this equal to upstream's own."""
    if not all(_small(value) for _, value in writes):
        return None
    query = (
        saver.UPSERT_CHECKPOINT_WRITES_SQL
        if all(channel in WRITES_IDX_MAP for channel, _ in writes)
        else saver.INSERT_CHECKPOINT_WRITES_SQL
    )
    configurable = config["configurable"]
    params = saver._dump_writes(
        configurable["thread_id"],
        configurable["checkpoint_ns"],
        configurable["checkpoint_id"],
        task_id,
        task_path,
        writes,
    )
    return [(query, params, True)]
