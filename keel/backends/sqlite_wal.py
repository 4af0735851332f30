"""SQLite's write-ahead log, kept small: folded by Keel, watched for readers, truncated when idle.

Keel's connection runs `wal_autocheckpoint=0`: SQLite's own checkpoint ran inside the commit
that crossed its threshold, which may be on the event loop's thread (`SqliteConnector._here`).
`WalKeeper` folds the WAL into the database instead, on the database thread under the
connector's lock, every `WAL_CHECKPOINT_BYTES` counted. A PASSIVE checkpoint cannot fold the
frames a reader's snapshot still needs (a `sqlite3` shell, a backup, a console query left open
in a transaction): the WAL then grows with every commit, and never shrinks by itself. The keeper
says so (a `sqlite.wal_blocked` warning, at most once per `warn_every` while it lasts, and a
`sqlite.wal_unblocked` line when it ends), and once the database has been quiet for
`idle_after` seconds it truncates the WAL file to zero bytes (`wal_checkpoint(TRUNCATE)`,
without waiting on readers: a busy answer is tried again later). `journal_size_limit` bounds
what a restarted WAL keeps on disk between those truncations.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import aiosqlite

from keel.backends.locks import TaskReentrantLock

log = logging.getLogger("keel.store")

WAL_CHECKPOINT_BYTES = 4 * 1024 * 1024
"""Bytes committed (as counted by `WalKeeper.wrote`) between two WAL checkpoints: SQLite's own
default, 1000 pages of 4 KiB."""
SMALL_TRANSACTION = 16 * 1024
"""What a transaction of unknown size counts for: a few pages of rows, their indexes and the
WAL frames' headers."""
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024
"""Bytes a WAL file keeps on disk when SQLite restarts it from its beginning (after a complete
checkpoint): a WAL that grew past it while a reader held it back is cut down to it."""
IDLE_SECONDS = 5.0
"""Seconds without a write after which the WAL file is truncated to zero bytes."""
WARN_AFTER = 60.0
"""Seconds a reader may hold checkpoints back before `sqlite.wal_blocked` is logged."""
WARN_EVERY = 300.0
"""Seconds between two `sqlite.wal_blocked` warnings while the same reader holds on."""

Answer = tuple[int, int, int]
"""`PRAGMA wal_checkpoint`'s row: (busy, frames in the WAL, frames folded into the database)."""


async def open_wal(conn: aiosqlite.Connection, busy_timeout_ms: int) -> None:
    """Keel's connection in WAL mode, with its WAL pragmas."""
    # Switching a new file to WAL takes an exclusive lock and SQLite answers "database is
    # locked" at once, without its busy handler, when another connection opens it too
    # (two `keel migrate` on a fresh file): wait here as the busy timeout would.
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.01)
    # Checkpoints run on the database thread (`WalKeeper`): SQLite's own ran inside the
    # commit that crossed its threshold, on the loop's thread for a lone execution.
    await conn.execute("PRAGMA wal_autocheckpoint=0")
    await conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")


def checkpoint(conn: sqlite3.Connection) -> Answer | None:
    """Fold what the WAL holds into the database, as far as readers let (PASSIVE: it never
    waits, never takes a lock)."""
    row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row is not None else None


def _size(path: str | None) -> int:
    if path is None:
        return 0
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _fold_on_thread(
    conn: sqlite3.Connection, fold: Callable[[sqlite3.Connection], Any], wal: str | None
) -> tuple[Any, int]:
    return fold(conn), _size(wal)


def _truncate_on_thread(
    conn: sqlite3.Connection, busy_timeout_ms: int, wal: str | None
) -> tuple[Any, int]:
    # No busy handler: a reader or a writer elsewhere answers "busy" at once (the pragma's
    # first column), never a wait on this thread that the connector's lock would prolong.
    conn.execute("PRAGMA busy_timeout=0")
    try:
        row = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    answer = (int(row[0]), int(row[1]), int(row[2])) if row is not None else None
    return answer, _size(wal)


def _megabytes(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB"


def _seconds(span: float) -> str:
    return f"{span:.1f} s" if span < 10 else f"{span:.0f} s"


class WalKeeper:
    """The WAL of one `SqliteConnector`'s connection: folded, watched, truncated when idle.

    `fold_every`, `idle_after`, `warn_after`, `warn_every` and `clock` (monotonic seconds) are
    read at each use: a test may set them on an open connector."""

    def __init__(
        self,
        connection: Callable[[], aiosqlite.Connection],
        lock: TaskReentrantLock,
        *,
        path: str,
        busy_timeout_ms: int,
        fold: Callable[[sqlite3.Connection], Any] = checkpoint,
    ) -> None:
        self._connection = connection
        self._lock = lock
        self._wal = None if path == ":memory:" else f"{path}-wal"
        self._busy_timeout_ms = busy_timeout_ms
        self._fold_with = fold
        self.fold_every = WAL_CHECKPOINT_BYTES
        self.idle_after = IDLE_SECONDS
        self.warn_after = WARN_AFTER
        self.warn_every = WARN_EVERY
        self.clock: Callable[[], float] = time.monotonic
        self._counted = 0
        self._last_write = 0.0
        self._folding: asyncio.Future[None] | None = None
        self._idle: asyncio.Task[None] | None = None
        self._blocked_since: float | None = None
        self._blocked_frames = 0
        self._warned_at: float | None = None

    def wrote(self, sizes: list[int]) -> None:
        """On the loop, after a commit (in the connector's lock): count what the transactions
        wrote to the WAL (what their callers said, a small transaction's worth otherwise); past
        `fold_every`, fold the WAL into the database, on the database thread; and truncate it
        once no write has come for `idle_after` seconds."""
        self._counted += sum(max(size, SMALL_TRANSACTION) for size in sizes)
        self._last_write = self.clock()
        if self._counted >= self.fold_every and self._folding is None:
            self._counted = 0
            self._folding = asyncio.ensure_future(self._fold())
        if self._idle is None and self._wal is not None:
            self._idle = asyncio.ensure_future(self._truncate_when_idle())

    async def _fold(self) -> None:
        try:
            async with self._lock:  # no transaction on the loop's thread meanwhile
                conn = self._connection()
                answer, size = await conn._execute(
                    _fold_on_thread, conn._conn, self._fold_with, self._wal
                )
        except Exception as exc:  # the next threshold tries again; a closed connection folds
            log.warning("SQLite WAL checkpoint failed: %r", exc)
            return
        finally:
            self._folding = None
        self._observe(answer, size)

    async def _truncate_when_idle(self) -> None:
        try:
            while True:
                quiet = self.clock() - self._last_write
                if quiet < self.idle_after:
                    await asyncio.sleep(self.idle_after - quiet)
                    continue
                began = self._last_write
                if await self._truncate() and self._last_write == began:
                    return  # empty; the next write starts the watch again
                # A reader (or another process's writer) held it: try again once quiet.
                await asyncio.sleep(self.idle_after)
        except Exception as exc:  # a closed or failing file: the next write starts it again
            log.warning("SQLite WAL truncation failed: %r", exc)
        finally:
            self._idle = None

    async def _truncate(self) -> bool:
        async with self._lock:
            conn = self._connection()
            answer, size = await conn._execute(
                _truncate_on_thread, conn._conn, self._busy_timeout_ms, self._wal
            )
        self._observe(answer, size)
        return answer is not None and answer[0] == 0

    def _observe(self, answer: Any, size: int) -> None:
        """What a checkpoint answered: whether a reader holds frames back, since when."""
        if not isinstance(answer, tuple) or len(answer) != 3:
            return  # a fold that said nothing
        _, frames, folded = answer
        if frames < 0:
            return  # not a WAL database (":memory:")
        now = self.clock()
        if folded >= frames:
            self._caught_up(now, size)
            return
        if self._blocked_since is not None and frames < self._blocked_frames:
            # The WAL restarted from its beginning since: everything was folded meanwhile,
            # and what is held back now is a new reader's.
            self._caught_up(now, size)
        if self._blocked_since is None:
            self._blocked_since = now
        self._blocked_frames = frames
        held = now - self._blocked_since
        if held < self.warn_after:
            return
        if self._warned_at is not None and now - self._warned_at < self.warn_every:
            return
        self._warned_at = now
        log.warning(
            "SQLite WAL at %s: a reader has held back checkpoints for %s (a long read "
            "transaction: a `sqlite3` shell, a backup, a console query left open); the WAL "
            "grows with every commit until it ends",
            _megabytes(size),
            _seconds(held),
            extra={
                "event": "sqlite.wal_blocked",
                "event_data": {
                    "held_seconds": round(held, 3),
                    "wal_bytes": size,
                    "frames": frames,
                    "folded": folded,
                },
            },
        )

    def _caught_up(self, now: float, size: int) -> None:
        if self._warned_at is not None and self._blocked_since is not None:
            held = now - self._blocked_since
            log.info(
                "SQLite WAL checkpoints caught up after a reader held them back for %s (WAL at %s)",
                _seconds(held),
                _megabytes(size),
                extra={
                    "event": "sqlite.wal_unblocked",
                    "event_data": {"held_seconds": round(held, 3), "wal_bytes": size},
                },
            )
        self._blocked_since = None
        self._blocked_frames = 0
        self._warned_at = None

    async def close(self) -> None:
        """Before the connection closes: the fold under way ends, the idle watch stops."""
        idle, folding = self._idle, self._folding
        if idle is not None:
            idle.cancel()
        waiting = [f for f in (idle, folding) if f is not None]
        await asyncio.gather(*waiting, return_exceptions=True)
