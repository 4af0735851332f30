"""PostgreSQL connector: psycopg 3 with a connection pool; row locks fence concurrent owners.

Queries read time from `keel_now()` (the server's clock, defined by migration 0005). A test
clock, when one drives this connector, is handed to it per checkout in the `keel.fake_now`
setting, which `keel_now()` reads first.

Nothing here waits on the network without a bound (docs/operations.md, "Network partitions and
half-open connections"): connections carry TCP keepalives, a TCP user timeout and a connect
timeout tied to the lease TTL, and every checkout of a pooled connection (a transaction, a
statement, a read, a saver call, the pool's own check) is abandoned past the round-trip bound:
its socket is shut down under psycopg, the connection is closed and `RoundTripTimeout`, an
infrastructure fault, is raised (keel.backends.pg_bounds). A half-open path (a NAT, load
balancer or pooler that lost the flow and swallows what is sent) answers nothing and closes
nothing: only that bound notices.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import select
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from keel.backends.pg_batch import PREPARE_REFUSED, PREPARED_LOST, SET_FAKE_NOW, Batch
from keel.backends.pg_bounds import ROUND_TRIP_SETTING as ROUND_TRIP_SETTING
from keel.backends.pg_bounds import (
    UNBOUNDED_QUERIES,
    Watch,
    connection_options,
    exempt,
    round_trip_bound,
    watched,
)
from keel.backends.pg_bounds import RoundTripTimeout as RoundTripTimeout
from keel.core.errors import LeaseLost, RunNotFound
from keel.core.store.base import Later, Params, Row, Statement, Tx, load_queries

T = TypeVar("T")

log = logging.getLogger("keel.store")

IDLE_IN_TRANSACTION_TIMEOUT = "10s"
"""How long the server lets one of Keel's transactions sit idle before it ends it, unless the
deployment set its own bound (`ALTER DATABASE/ROLE ... SET idle_in_transaction_session_timeout`,
docs/workers.md). Keel's own transactions never wait on anything but the database; one that is
idle this long belongs to a frozen worker (SIGSTOP, a suspended VM, a stalled host) whose row
locks, its run's among them, would otherwise stop every other worker from taking the run over
until its TCP connection dies (keel chaos --fault freeze finds it). The frozen worker then finds
its connection gone: an infrastructure fault, not a run failure."""


LOOPS_BESIDE_RUNS = 4
"""Pooled connections a worker's own loops may hold at once besides its runs' (heartbeat,
claims, the outbox's lanes, the scheduler): what `make_room` adds to the runs it is told of."""


async def _configure(conn: AsyncConnection[DictRow], *, bound: float | None = None) -> None:
    # Only where nothing bounds it yet (0, the server's default): a database or role setting
    # the deployment chose is kept.
    with watched(conn, bound, "a new connection's setup"):
        await conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)"
            " WHERE current_setting('idle_in_transaction_session_timeout') = '0'",
            (IDLE_IN_TRANSACTION_TIMEOUT,),
        )
    _idle_since[conn] = time.monotonic()


CHECK_AFTER_IDLE = 10.0
"""Seconds a pooled connection may sit unused before its next checkout checks it."""

_idle_since: weakref.WeakKeyDictionary[AsyncConnection[Any], float] = weakref.WeakKeyDictionary()


class _Pool(AsyncConnectionPool[AsyncConnection[DictRow]]):
    """The pool, stamping each connection's return for `_check` and handing out the connection
    returned last. Stamped here rather than by a `reset` callback: with one, psycopg_pool hands
    every return to a background task, so the connection comes back a loop turn (or more) after
    its transaction ended and the next step's checkout often finds it still away.

    Each checkout is bounded by `bound` (see `Watch`); a connection that timed out, or comes
    back inside a transaction or a query, is closed rather than rolled back by the pool (a
    round trip more on a path that may not answer)."""

    bound: float | None = None

    @asynccontextmanager
    async def connection(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 (psycopg_pool's signature)
        *,
        what: str = "a checkpoint saver call",
    ) -> AsyncIterator[AsyncConnection[DictRow]]:
        # psycopg_pool's own, without its `async with conn` (a commit or rollback that finds
        # no transaction on these autocommit connections) and with the watch.
        conn = await self.getconn(timeout)
        watch: Watch | None = None
        try:
            if self.bound is None:
                yield conn
            else:
                with Watch(conn, self.bound, what) as watch:
                    yield conn
        finally:
            if (watch is not None and watch.fired) or conn.pgconn.transaction_status not in (
                TransactionStatus.IDLE,
                TransactionStatus.UNKNOWN,
            ):
                await conn.close()
            await self.putconn(conn)

    async def putconn(self, conn: AsyncConnection[DictRow]) -> None:
        _idle_since[conn] = time.monotonic()
        await super().putconn(conn)

    async def _get_ready_connection(
        self,
        timeout: float | None,  # noqa: ASYNC109 (psycopg_pool's signature)
    ) -> AsyncConnection[DictRow] | None:
        # Last in, first out: psycopg_pool takes the connection idle longest, so a run's steps
        # went round every connection of the pool, each step to a server process whose caches
        # had gone cold since its last turn (a 5-step run's messages took 0.6-1.0 ms on the
        # server where one warm process takes 0.4-0.6). The ones left idle are the ones the
        # pool closes after `max_idle`.
        if self._pool:
            self._pool.rotate(1)
        return await super()._get_ready_connection(timeout)


async def _check(conn: AsyncConnection[Any], *, bound: float | None = None) -> None:
    """Check a connection at checkout only if it may be broken: the server said something
    while it sat in the pool (a terminated backend, a shutdown: its socket is readable) or it
    idled long enough for a proxy or firewall to drop it. A check at every checkout would cost
    a round trip per transaction. Bounded: a check that hangs fails, and the pool takes (or
    opens) another connection."""
    idle = time.monotonic() - _idle_since.get(conn, 0.0)
    if idle > CHECK_AFTER_IDLE or _readable(conn):
        with watched(conn, bound, "a pooled connection's check"):
            await AsyncConnectionPool.check_connection(conn)


def _readable(conn: AsyncConnection[Any]) -> bool:
    try:
        ready, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True  # no usable socket: let the check find out
    return bool(ready)


FENCE_SQLSTATE, NO_RUN_SQLSTATE = "KL001", "KL002"
"""What `keel_fence` (migration 0013) raises: a stale lease token, no such run."""


def _fence_error(exc: BaseException) -> BaseException | None:
    """LeaseLost (or RunNotFound) if the fence aborted the transaction, anywhere in the chain
    (a message of several statements reports the first that failed)."""
    seen: BaseException | None = exc
    while seen is not None:
        state = getattr(seen, "sqlstate", None)
        if state in (FENCE_SQLSTATE, NO_RUN_SQLSTATE):
            diag = getattr(seen, "diag", None)
            message = (diag.message_primary if diag else None) or str(seen)
            return LeaseLost(message) if state == FENCE_SQLSTATE else RunNotFound(message)
        seen = seen.__cause__ or seen.__context__
    return None


# OperationalError covers lost connections, admin/crash shutdown, pool timeouts, serialization
# failures and deadlocks, resource exhaustion (disk full, too many connections). A read-only
# transaction or an idle-in-transaction timeout means a failover or a stalled connection.
_TRANSIENT: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.errors.ReadOnlySqlTransaction,
    psycopg.errors.IdleInTransactionSessionTimeout,
)


def is_transient(exc: BaseException) -> bool:
    """PostgreSQL or its connection failed, not the statement: retrying later can succeed."""
    return isinstance(exc, _TRANSIENT)


class PostgresTx:
    pipelined = False  # `send` runs its statement now (its row is then read locally)

    def __init__(self, conn: AsyncConnection[DictRow], queries: dict[str, str]) -> None:
        self.connection = conn
        self._queries = queries

    async def one(self, name: str, params: Params | None = None) -> Row | None:
        if name in UNBOUNDED_QUERIES:
            with exempt(self.connection):
                cur = await self.connection.execute(self._queries[name], params or {})
        else:
            cur = await self.connection.execute(self._queries[name], params or {})
        if cur.description is None:
            return None
        row = await cur.fetchone()
        return dict(row) if row is not None else None

    async def all(self, name: str, params: Params | None = None) -> list[Row]:
        cur = await self.connection.execute(self._queries[name], params or {})
        return [dict(r) for r in await cur.fetchall()]

    async def execute(self, name: str, params: Params | None = None) -> int:
        cur = await self.connection.execute(self._queries[name], params or {})
        return cur.rowcount

    async def script(self, sql: str) -> None:
        with exempt(self.connection):  # a migration's DDL
            await self.connection.execute(sql.encode())

    async def send(self, name: str, params: Params | None = None) -> Later:
        cur = self.connection.cursor()
        await cur.execute(self._queries[name], params or {})

        async def later() -> Row | None:
            row = await cur.fetchone()
            return dict(row) if row is not None else None

        return later

    async def replay(self, statement: Statement) -> None:
        sql, params, many = statement
        # Binary, as LangGraph's saver runs it (its blobs are bytea).
        cur = self.connection.cursor(binary=True)
        if many:
            await cur.executemany(sql, params)
        else:
            await cur.execute(sql, params)


class PostgresConnector:
    dialect = "postgres"
    notifies = True
    shared = True

    is_transient = staticmethod(is_transient)

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        lease_ttl: float = 30.0,
        round_trip_timeout: float | None = None,
    ) -> None:
        """`round_trip_timeout`: seconds a transaction, statement or read may take before its
        connection is abandoned (RoundTripTimeout); None: KEEL_DB_ROUND_TRIP_TIMEOUT if set,
        else a third of `lease_ttl` (at least 2 s); 0: unbounded."""
        self.url = normalize_postgres_url(url)
        self._queries = load_queries(self.dialect)
        self._pool: _Pool | None = None
        self._min_size, self._max_size = min_size, max_size
        self._runs = 0  # executions the workers on this connector may run at once
        self.clock_override: Callable[[], float] | None = None
        self.lease_ttl = lease_ttl
        self.round_trip_timeout = (
            round_trip_bound(lease_ttl, os.environ.get(ROUND_TRIP_SETTING))
            if round_trip_timeout is None
            else round_trip_timeout or None
        )
        self.connect_options = connection_options(self.url, lease_ttl, self.round_trip_timeout)

    @property
    def pool(self) -> _Pool:
        if self._pool is None:
            raise RuntimeError("the PostgreSQL connector is not open")
        return self._pool

    async def attach_saver(
        self, setup: Callable[[], Awaitable[None]], alone: Callable[[], bool]
    ) -> None:
        """Nothing to do: the saver sets itself up in `migrate`, on its own connections."""

    async def open(self) -> None:
        if self._pool is not None:
            return
        bound = self.round_trip_timeout
        pool = _Pool(
            self.url,
            min_size=self._min_size,
            max_size=self._max_size,
            open=False,
            # The LangGraph saver needs autocommit and dict rows; Keel opens its own transactions.
            kwargs={"autocommit": True, "row_factory": dict_row, **self.connect_options},
            # A connection the server dropped (restart, failover, proxy timeout) is replaced at
            # checkout instead of failing the run whose write drew it; `_check` says when.
            check=functools.partial(_check, bound=bound),
            configure=functools.partial(_configure, bound=bound),
            # Waiting for a connection is bounded as a round trip is (psycopg_pool: 30 s).
            timeout=bound if bound is not None else 30.0,
            # psycopg_pool retries a connection it cannot make with a delay that doubles, for
            # 5 minutes: once the path heals, a worker could wait that long for its next try.
            # Given up after a lease TTL instead, a connection is made anew when one is wanted.
            reconnect_timeout=max(self.lease_ttl, 5.0),
        )
        pool.bound = bound
        try:
            await pool.open(wait=True, timeout=15)
        except BaseException:
            # A pool that never opened keeps reconnecting in the background unless closed.
            await pool.close()
            raise
        self._pool = pool

    async def make_room(self, runs: int) -> None:
        """Let the pool grow to a connection per execution of every worker on it, plus
        `LOOPS_BESIDE_RUNS`: at 10 runs a worker, its heartbeats, outbox lanes and scheduler
        would otherwise queue behind the runs for the default 10. Connections are still made
        only when wanted. A worker stopping gives its runs back (negative `runs`); the pool
        keeps its size, which the next worker's runs then fit in."""
        self._runs = max(0, self._runs + runs)
        wanted = max(self._max_size, self._runs + LOOPS_BESIDE_RUNS)
        if self._pool is not None and wanted > self._pool.max_size:
            await self._pool.resize(self._pool.min_size, wanted)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PostgresTx]:
        async with self.pool.connection(what="a transaction") as conn:
            await self._set_clock(conn)
            async with conn.transaction():
                yield PostgresTx(conn, self._queries)

    async def single(self, name: str, params: Params | None = None) -> Row | None:
        # The pool's connections are autocommit: the statement is its own transaction, with no
        # BEGIN or COMMIT round trip.
        async with self.pool.connection(what=name) as conn:
            await self._set_clock(conn)
            cur = await conn.execute(self._queries[name], params or {})
            row = await cur.fetchone() if cur.description is not None else None
        return dict(row) if row is not None else None

    async def run_transaction(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """`body`'s statements, bound here, sent as one simple-query message at its end: one
        round trip and one transaction (the server runs a message's statements as one, and
        stops at the first that fails: a stale token's fence rolls back everything after it).

        One message, not a pipeline of many: the server reads a whole message before it runs
        any of it, so a worker frozen (SIGSTOP, a paused VM) while it sends its step holds no
        lock. A pipeline's first statements run at once, the fence's FOR SHARE on the run among
        them, and no timeout ends a transaction waiting for the rest of its pipeline: the
        frozen worker's run could not be taken over. A `body` that reads a row before its end
        sends what it has (with BEGIN) to get it; the transaction then waits between messages
        as any other, under `idle_in_transaction_session_timeout`. Repeated statements are
        prepared once per connection (keel.backends.pg_batch)."""
        async with self.pool.connection(what="a step transaction") as conn:
            try:
                return await self._batched(conn, body)
            except psycopg.Error as exc:
                if exc.sqlstate not in PREPARE_REFUSED and exc.sqlstate != PREPARED_LOST:
                    raise
                # A statement the server would not PREPARE, or a prepared one it lost (and so
                # nothing ran): again, with those bound inline or prepared anew.
                return await self._batched(conn, body)

    async def _batched(
        self, conn: AsyncConnection[DictRow], body: Callable[[Tx], Awaitable[T]]
    ) -> T:
        batch = Batch(conn, self._queries)
        try:
            if self.clock_override is not None:
                batch.add(SET_FAKE_NOW, (repr(float(self.clock_override())),))
            result = await body(batch)
            await batch.flush(end=True)
            return result
        except BaseException as exc:
            status = conn.info.transaction_status
            if status in (
                psycopg.pq.TransactionStatus.INTRANS,
                psycopg.pq.TransactionStatus.INERROR,
            ):
                with contextlib.suppress(psycopg.Error):
                    await conn.rollback()  # before the connection goes back to the pool
            if (
                isinstance(exc, psycopg.Error)
                and exc.sqlstate in PREPARE_REFUSED
                and batch.prepares
            ):
                batch.refused()
                raise
            fenced = _fence_error(exc)
            if fenced is not None:
                raise fenced from None
            raise

    @asynccontextmanager
    async def read(self) -> AsyncIterator[PostgresTx]:
        async with self.pool.connection(what="a read") as conn:
            await self._set_clock(conn)
            yield PostgresTx(conn, self._queries)

    async def _set_clock(self, conn: AsyncConnection[DictRow]) -> None:
        # Session-wide, on every checkout: all of this pool's connections serve the same clock,
        # and production never sets it (keel_now() is then the server's clock_timestamp()).
        if self.clock_override is not None:
            now = repr(float(self.clock_override()))
            await conn.execute("SELECT set_config('keel.fake_now', %s, false)", (now,))

    async def listen(self, channel: str, on_notify: Callable[[str | None], None]) -> None:
        """Call `on_notify` with the payload of every NOTIFY on `channel` until cancelled;
        reconnect on errors (and call `on_notify(None)`: what was sent meanwhile is lost).

        The wait for notifications is not bounded by the round-trip bound (a quiet system sends
        none for hours), but every half lease TTL without one the connection is checked, within
        the bound: a dead or half-open path is noticed, and the connection made again."""
        bound = self.round_trip_timeout
        every = max(self.lease_ttl / 2, 0.5)
        while True:
            try:
                conn = await AsyncConnection.connect(
                    self.url, autocommit=True, **self.connect_options
                )
                async with conn:
                    with watched(conn, bound, f"LISTEN {channel}"):
                        await conn.execute(f"LISTEN {channel}")
                    on_notify(None)  # anything sent while we were not listening
                    while True:
                        async for notify in conn.notifies(timeout=every):
                            on_notify(notify.payload)
                        with watched(conn, bound, f"the LISTEN {channel} connection's check"):
                            await AsyncConnectionPool.check_connection(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN %s failed (%r); polling until it reconnects", channel, exc)
                await asyncio.sleep(1.0)


def normalize_postgres_url(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url.removeprefix(prefix)
    return url
