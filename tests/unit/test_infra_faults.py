"""The one rule that tells infrastructure faults from the graph's own failures, by cause chain."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
import psycopg_pool
import pytest

from keel.backends.postgres import is_transient as pg_transient
from keel.backends.sqlite import is_transient as sqlite_transient
from keel.core.infra import Attempts, backoff, is_infrastructure, is_keel_fault, outlast


def _sqlite_error(sql: str, setup: str | None = None) -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    if setup:
        conn.execute(setup)
    try:
        conn.execute(sql)
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("no error")


def _raised_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as got:
        return got


def _raised_while_handling(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - the implicit context is what is under test
    except BaseException as got:
        return got


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.DiskFull("could not extend file"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"),
        psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_postgres_connection_and_server_faults_are_infrastructure(exc: Exception) -> None:
    assert is_infrastructure(exc, pg_transient)


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.errors.UniqueViolation("duplicate key"),
        psycopg.errors.UndefinedColumn("column does not exist"),
        ValueError("the node's own bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_statement_errors_and_user_errors_are_not(exc: Exception) -> None:
    assert not is_infrastructure(exc, pg_transient)


def test_sqlite_full_busy_and_io_errors_are_infrastructure_by_their_result_code() -> None:
    for code, name in [
        (sqlite3.SQLITE_FULL, "database or disk is full"),
        (sqlite3.SQLITE_BUSY, "database is locked"),
        (sqlite3.SQLITE_IOERR, "disk I/O error"),
        (sqlite3.SQLITE_IOERR | (4 << 8), "disk I/O error"),  # an extended code (IOERR_READ)
    ]:
        exc = sqlite3.OperationalError(name)
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
        assert is_infrastructure(exc, sqlite_transient), name


def test_real_sqlite_statement_errors_are_not_infrastructure() -> None:
    syntax = _sqlite_error("SELEC 1")
    constraint = _sqlite_error("INSERT INTO t VALUES (1), (1)", "CREATE TABLE t (x PRIMARY KEY)")
    assert not is_infrastructure(syntax, sqlite_transient)
    assert not is_infrastructure(constraint, sqlite_transient)


def test_a_full_disk_is_infrastructure_whoever_hits_it() -> None:
    assert is_infrastructure(OSError(errno.ENOSPC, "No space left on device"), lambda e: False)
    assert not is_infrastructure(OSError(errno.ENOENT, "No such file"), lambda e: False)


def test_a_fault_wrapped_or_re_raised_by_langgraph_is_found_in_the_chain() -> None:
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert is_infrastructure(_raised_from(lost, RuntimeError("task failed")), pg_transient)
    assert is_infrastructure(_raised_while_handling(lost, KeyError("x")), pg_transient)
    group = ExceptionGroup("fan-out", [ValueError("a"), _raised_from(lost, TypeError("b"))])
    assert is_infrastructure(group, pg_transient)
    assert not is_infrastructure(
        _raised_from(ValueError("bad"), RuntimeError("task failed")), pg_transient
    )


def test_a_cyclic_chain_ends() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert not is_infrastructure(a, pg_transient)


def test_backoff_grows_with_jitter_and_stays_under_its_cap() -> None:
    for attempt in range(1, 20):
        ceiling = min(8.0, 0.5 * 2 ** (attempt - 1))
        delays = [backoff(attempt, base=0.5, cap=8.0) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert len({backoff(3, base=1.0, cap=60.0) for _ in range(20)}) > 1  # jittered


def test_attempt_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Attempts(max_crashes=0)
    with pytest.raises(ValueError, match="backoff"):
        Attempts(backoff=-1)


def _locked_by_keel(path: Path) -> BaseException:
    """The error Keel's own SQLite connector raises when another process holds the file."""
    from keel.backends.sqlite import SqliteConnector

    async def write() -> None:
        connector = SqliteConnector(f"sqlite:///{path}", busy_timeout_ms=50)
        await connector.open()
        try:
            async with connector.transaction():
                pass
        finally:
            await connector.close()

    try:
        asyncio.run(write())
    except Exception as exc:
        return exc
    raise AssertionError("the write went through a held lock")


def test_only_a_fault_of_a_call_keel_made_gives_the_run_back(tmp_path: Path) -> None:
    # Both are "database is locked" from the same driver, on the same kind of file: one raised
    # in Keel's connector (the run's database), one in the graph's own code (a node's database).
    path = tmp_path / "held.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")  # as Keel's file is
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        keels = _locked_by_keel(path)
        users = _sqlite_error_on(path)
    finally:
        holder.close()
    for exc in (keels, users):
        assert is_infrastructure(exc, sqlite_transient), exc
    assert is_keel_fault(keels, sqlite_transient)
    assert not is_keel_fault(users, sqlite_transient)
    assert not is_keel_fault(_raised_from(users, RuntimeError("task failed")), sqlite_transient)
    assert is_keel_fault(_raised_from(keels, RuntimeError("task failed")), sqlite_transient)
    # A full disk under the node's own file is the node's; without a traceback, Keel's.
    assert is_keel_fault(OSError(errno.ENOSPC, "No space left"), lambda e: False)


def _sqlite_error_on(path: Path) -> sqlite3.Error:
    conn = sqlite3.connect(path, timeout=0.05)
    try:
        conn.execute("INSERT INTO t VALUES (1)")
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("no error")


def _outage_until(n: int) -> tuple[Callable[[], Awaitable[str]], list[int]]:
    """A write that meets a lost connection `n` times, then succeeds; and its tries."""
    tries: list[int] = []

    async def write() -> str:
        tries.append(len(tries) + 1)
        if len(tries) <= n:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return "recorded"

    return write, tries


def test_a_record_outlasts_an_outage_but_not_a_statement_error_nor_a_stop() -> None:
    outage = is_infrastructure_of_postgres

    write, tries = _outage_until(2)
    assert asyncio.run(outlast(write, outage, "intent i")) == "recorded"
    assert tries == [1, 2, 3]

    async def refused() -> None:
        raise psycopg.errors.UniqueViolation("duplicate key")

    with pytest.raises(psycopg.errors.UniqueViolation):  # a bug, not an outage: raised at once
        asyncio.run(outlast(refused, outage, "intent i"))

    write, tries = _outage_until(10**6)
    with pytest.raises(psycopg.OperationalError):  # given up once its time is spent
        asyncio.run(outlast(write, outage, "intent i", within=0.5))

    async def stopped() -> float:
        stop = asyncio.Event()
        write, _ = _outage_until(10**6)
        task = asyncio.create_task(outlast(write, outage, "intent i", stop=stop))
        await asyncio.sleep(0.5)  # retrying, with 600 s to go
        stop.set()
        began = asyncio.get_running_loop().time()
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(task, 5)
        return asyncio.get_running_loop().time() - began

    assert asyncio.run(stopped()) < 5, "a process told to stop waited out the outage"


def is_infrastructure_of_postgres(exc: BaseException) -> bool:
    return is_infrastructure(exc, pg_transient)
