"""SQLite connector: one connection per process, WAL, BEGIN IMMEDIATE for writes.

SQLite lives on one host, so the host's clock is the database's: `keel_now()`, which every query
uses for leases and deadlines as PostgreSQL's does, is a function defined on the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite

from keel.backends.locks import TaskReentrantLock
from keel.backends.sqlite_tx import (
    SqliteTx,
    ThreadTx,
    injected_failure,
    is_transient,
    run_to_end,
    split_chain,
)
from keel.backends.sqlite_wal import WAL_CHECKPOINT_BYTES as WAL_CHECKPOINT_BYTES
from keel.backends.sqlite_wal import WalKeeper, open_wal
from keel.backends.sqlite_wal import checkpoint as _checkpoint
from keel.core.codec import json_contains
from keel.core.errors import LeaseLost, UsageError
from keel.core.ids import digest
from keel.core.notifications import notification_payload
from keel.core.store.base import BULKY, Params, Row, Tx, load_queries, writing

T = TypeVar("T")


def _fold(conn: sqlite3.Connection) -> Any:
    # `_checkpoint` looked up at each fold: a test may watch it (tests/store/test_sqlite_busy.py).
    return _checkpoint(conn)


def _nothing() -> None:
    return None


class _Pending:
    """One `run_transaction` waiting for its group's COMMIT."""

    def __init__(
        self, body: Callable[[Tx], Awaitable[Any]], context: contextvars.Context, loop: Any
    ) -> None:
        self.body = body
        self.context = context
        self.done: asyncio.Future[None] = loop.create_future()
        self.size = context.get(writing, 0)
        self.bulky = self.size > BULKY
        self.result: Any = None
        self.error: BaseException | None = None

    def failed(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc

    def settle(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class SqliteConnector:
    dialect = "sqlite"
    notifies = False
    is_transient = staticmethod(is_transient)

    def __init__(self, url: str, *, busy_timeout_ms: int = 10_000, synchronous: str = "FULL"):
        self.url = url
        self.path = sqlite_path(url)
        self.shared = self.path != ":memory:"
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._queries = load_queries(self.dialect)
        self._chains = {name: split_chain(sql) for name, sql in self._queries.items()}
        self._named = (self._queries, self._chains)
        self._conn: aiosqlite.Connection | None = None
        self.clock_override: Callable[[], float] | None = None
        # Shared with the checkpoint saver, which runs on the same connection.
        self.lock = TaskReentrantLock()
        self._pending: list[_Pending] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None
        self._late: set[asyncio.Future[None]] = set()
        self.wal = WalKeeper(
            lambda: self.connection,
            self.lock,
            path=self.path,
            busy_timeout_ms=busy_timeout_ms,
            fold=_fold,
        )
        self.commit_here_when: Callable[[], bool] | None = None
        """Set by the runtime: whether a transaction may run on the event loop's own thread,
        without the hand-off to the database thread and back (see `_flush_now`)."""

    async def attach_saver(
        self, setup: Callable[[], Awaitable[None]], alone: Callable[[], bool]
    ) -> None:
        await setup()  # idempotent; its lazy setup would commit our transactions
        # Transactions commit on the loop's own thread while at most one execution runs.
        self.commit_here_when = alone

    @property
    def connection(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise RuntimeError("the SQLite connector is not open")
        return self._conn

    async def open(self) -> None:
        if self._conn is not None:
            return
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Usable from the event loop's thread too (`_flush_now`); every use is still one at a
        # time, under `lock`.
        conn = await aiosqlite.connect(
            self.path, timeout=self._busy_timeout_ms / 1000, check_same_thread=False
        )
        try:
            conn.row_factory = sqlite3.Row
            await open_wal(conn, self._busy_timeout_ms)  # Keel folds it: keel.backends.sqlite_wal
            await conn.execute(f"PRAGMA synchronous={self._synchronous}")
            await conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            await conn.create_function("keel_now", 0, self._keel_now)
            await conn.create_function("keel_fence", 3, self._keel_fence)
            # Ids derived in SQL (a decision's intents) by the one rule, keel.core.ids.digest.
            await conn.create_function("keel_digest", -1, digest, deterministic=True)
            # A wait's notification payload (a registration's, a decision's intents): the rule.
            await conn.create_function(
                "keel_notification", 9, notification_payload, deterministic=True
            )
            # Metadata searches: PostgreSQL's `@>` (JSONB containment), by the one rule.
            await conn.create_function("keel_json_contains", 2, json_contains, deterministic=True)
        except BaseException:
            await conn.close()  # its thread would keep the process alive
            raise
        self._conn = conn

    def _keel_now(self) -> float:
        override = self.clock_override
        return override() if override is not None else time.time()

    _stale: LeaseLost | None = None

    def _keel_fence(self, run_id: str, held: int, token: int) -> int:
        # sqlite3 reports any exception a function raises as "user-defined function raised
        # exception": the reason waits here for run_transaction to raise it.
        if held != token:
            self._stale = LeaseLost(f"run {run_id}: lease token {token} is stale (current {held})")
            raise ValueError("stale lease token")
        return 1

    async def run_transaction(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """BEGIN IMMEDIATE, `body`, COMMIT: one call to the database thread.

        Group commit: transactions that arrive while one is on the thread wait for it, then go
        together in one call and one COMMIT (one fsync), each body in a savepoint of its own,
        so a body that fails (a stale fence) rolls back alone. Each caller returns after the
        COMMIT that made its body durable; a lone transaction goes at once, its caller's own
        call, as it would without a group."""
        # The caller's context on the thread: events the body adds are logged after the commit.
        entry = _Pending(body, contextvars.copy_context(), asyncio.get_running_loop())
        if self.lock.owned():
            # Inside this task's own open transaction (the lock is re-entrant): a group would
            # wait for the lock this task holds.
            await self._flush_now([entry])
            return cast(T, entry.outcome())
        self._pending.append(entry)
        try:
            if self._flushing:
                await entry.done
            else:
                await self._lead()
        except asyncio.CancelledError:
            if entry in self._pending:  # not taken yet: it never runs, as before the lock
                self._pending.remove(entry)
            raise
        return cast(T, entry.outcome())

    async def _lead(self) -> None:
        """The caller's own group (what waits now, itself first); later ones go to a task."""
        self._flushing = True
        try:
            async with self.lock:
                batch, self._pending = self._pending, []
                await self._flush_now(batch)
        finally:
            self._flushing = bool(self._pending)
            if self._flushing:
                self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._pending:
                async with self.lock:
                    batch, self._pending = self._pending, []
                    await self._flush_now(batch)
        except BaseException as exc:  # cancelled (the loop is closing): none may wait forever
            batch, self._pending = self._pending, []
            for entry in batch:
                entry.failed(exc)
                entry.settle()
            raise
        finally:
            self._flushing = False

    async def _flush_now(self, batch: list[_Pending]) -> None:
        try:
            conn = self.connection
            if not any(entry.bulky for entry in batch) and self._here(conn._conn):
                # One execution in flight: nothing else wants the loop while its step commits,
                # and the hand-off to the database thread and back cost ~0.1 ms per transaction
                # (of a 5-step run's ~8 ms, nearly 10%). Several executions take the thread,
                # where group commit lets one fsync serve them while their other work goes on;
                # so does a bulky transaction (a large state's step: writing its pages held the
                # loop for tens of ms, and the loop also serves heartbeats, claims, an API).
                self._group(conn._conn, batch, begun=True)
            else:
                await conn._execute(self._group, conn._conn, batch)
        except asyncio.CancelledError:
            # Only the caller leading the group is cancelled: the group goes on on the thread,
            # and its members hear how it went once it is done there.
            late = asyncio.ensure_future(self._settle_after(batch))
            self._late.add(late)
            late.add_done_callback(self._late.discard)
            raise
        except BaseException as exc:  # the call itself (a closed connection): every one fails
            for entry in batch:
                entry.failed(exc)
            if not isinstance(exc, Exception):
                raise
        for entry in batch:
            entry.settle()
        self.wal.wrote([entry.size for entry in batch])

    async def _settle_after(self, batch: list[_Pending]) -> None:
        try:
            await self.connection._execute(_nothing)  # the thread is FIFO: the group is done
        finally:
            for entry in batch:
                entry.settle()

    def _here(self, conn: sqlite3.Connection) -> bool:
        """Whether this transaction runs on the loop's thread, and if so, its BEGIN IMMEDIATE
        done. Only when the runtime says so, and when no group of a cancelled caller is still
        on the database thread. Another process's write lock answers at once (no busy wait:
        the loop must never sleep in SQLite's busy handler), and the transaction takes the
        thread, which waits for it."""
        if self._late or self.commit_here_when is None or not self.commit_here_when():
            return False
        conn.execute("PRAGMA busy_timeout=0")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return False  # busy, or failing: the thread's way waits, or says why
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
        return True

    def _group(self, conn: sqlite3.Connection, batch: list[_Pending], begun: bool = False) -> None:
        """On the database thread (or the loop's, `_here`): the batch in one transaction (a
        savepoint per body when there are several), committed once."""
        try:
            if not begun:
                conn.execute("BEGIN IMMEDIATE")
            if self._bodies(conn, batch):
                conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
            for entry in batch:
                entry.failed(exc)

    def _bodies(self, conn: sqlite3.Connection, batch: list[_Pending]) -> bool:
        """Each body of the open transaction; False when nothing is left to commit."""
        alone = len(batch) == 1
        for entry in batch:
            if not alone:
                conn.execute("SAVEPOINT keel_step")
            try:
                injected_failure()
                coro = cast(Coroutine[Any, Any, Any], entry.body(ThreadTx(conn, *self._named)))
                entry.result = entry.context.run(run_to_end, coro)
            except Exception as exc:
                entry.failed(self._reason(exc))
                if not conn.in_transaction:
                    # SQLite gave the whole transaction up (a full disk, an I/O error): the
                    # bodies before this one are lost with it.
                    raise
                if alone:
                    conn.execute("ROLLBACK")
                    return False
                conn.execute("ROLLBACK TO keel_step")
            if not alone:
                conn.execute("RELEASE keel_step")
        return True

    def _reason(self, exc: Exception) -> Exception:
        stale, self._stale = self._stale, None
        if stale is not None and isinstance(exc, sqlite3.OperationalError):
            return stale
        return exc

    async def make_room(self, runs: int) -> None:
        """One connection serves every execution: nothing to grow."""

    async def close(self) -> None:
        busy = (self._flusher, *self._late)
        waiting = [f for f in busy if f is not None and not f.done()]
        await asyncio.gather(*waiting, return_exceptions=True)
        await self.wal.close()
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqliteTx]:
        conn = self.connection
        async with self.lock:
            injected_failure()
            await conn.execute("BEGIN IMMEDIATE")
            try:
                yield SqliteTx(conn, self._queries, self._chains)
            except BaseException:
                await conn.rollback()
                raise
            try:
                await conn.commit()
            except BaseException:
                # A commit refused by a full or failing disk leaves the transaction open on
                # this shared connection: close it, or every later BEGIN fails for good.
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise
            self.wal.wrote([0])

    async def single(self, name: str, params: Params | None = None) -> Row | None:
        # One hand-off to aiosqlite's thread for the whole transaction (its public calls cost
        # one per statement, fetch and commit; private API, pinned with aiosqlite), and in the
        # group of step transactions waiting with it: an admission, a claim or an end shares
        # their COMMIT.
        async def chain(tx: Tx) -> Row | None:
            return await tx.one(name, params)

        return await self.run_transaction(chain)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[SqliteTx]:
        async with self.lock:
            injected_failure()
            yield SqliteTx(self.connection, self._queries, self._chains)

    async def listen(self, channel: str, on_notify: Callable[[str | None], None]) -> None:
        """SQLite has no notifications: workers in other processes poll with backoff."""
        return None


def sqlite_path(url: str) -> str:
    """`sqlite:///relative/path.db`, `sqlite:////abs/path.db`, `sqlite:///:memory:`."""
    if not url.startswith("sqlite://"):
        raise UsageError(f"not a SQLite URL: {url!r}")
    rest = url.removeprefix("sqlite://")
    if rest.startswith("/"):
        rest = rest[1:]
    if not rest:
        raise UsageError("a SQLite URL needs a file path: sqlite:///.keel/keel.db")
    if "?" in rest:
        # Taken as part of the file's name, it made a new, empty database beside the one meant.
        raise UsageError(f"a SQLite URL takes no query (?...): {url[:200]!r}")
    return rest
