"""The bench's traffic counters count exactly what the client asked of the database.

bench/wire.py is what docs/benchmarks.md's round trips, transactions and statements come
from; these tests drive a real PostgreSQL and a real SQLite file with known sequences and
check each count, so a counter that drifts fails here rather than in a report.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import psycopg
import pytest

from bench.wire import PgCounter, sqlite_counting

PG_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "postgresql://keel:keel@127.0.0.1:5432/keel")


@pytest.mark.postgres
def test_pg_counter_counts_round_trips_and_transactions(pg_template: str) -> None:
    with PgCounter(PG_URL) as counter, psycopg.connect(counter.url(PG_URL), autocommit=True) as c:
        assert counter.snapshot().connections == 1
        c.execute("CREATE TEMP TABLE t (i int)")

        def delta(action: object) -> tuple[int, int, int, int]:
            before = counter.snapshot()
            assert callable(action)
            action()
            d = counter.snapshot() - before
            return d.round_trips, d.pool_checks, d.transactions, d.writing

        # One autocommitted read: one round trip, one transaction that wrote nothing.
        assert delta(lambda: c.execute("SELECT 1").fetchone()) == (1, 0, 1, 0)
        # psycopg_pool's check: an empty query, which the server runs as an empty transaction.
        assert delta(lambda: c.execute("")) == (1, 1, 1, 0)

        def explicit() -> None:
            with c.transaction():
                c.execute("INSERT INTO t VALUES (1)")
                c.execute("SELECT count(*) FROM t").fetchone()

        # BEGIN, INSERT, SELECT, COMMIT: four waits for the server, one writing transaction.
        assert delta(explicit) == (4, 0, 1, 1)

        def rolled_back() -> None:
            with pytest.raises(ZeroDivisionError), c.transaction():
                c.execute("INSERT INTO t VALUES (2)")
                _ = 1 / 0

        # A rolled-back write costs no WAL flush.
        assert delta(rolled_back)[2:] == (1, 0)
        # An UPDATE that matched nothing wrote nothing; a data-modifying CTE (tag SELECT) did.
        assert delta(lambda: c.execute("UPDATE t SET i = 0 WHERE i < 0"))[2:] == (1, 0)
        cte = "WITH x AS (UPDATE t SET i = i + 1 RETURNING i) SELECT count(*) FROM x"
        assert delta(lambda: c.execute(cte).fetchone())[2:] == (1, 1)
        # psycopg prepares a statement at its sixth execution, one more wait for the server;
        # prepared or not, each execution is its own transaction.
        assert delta(lambda: [c.execute("SELECT %s::int", (i,)) for i in range(8)]) == (9, 0, 8, 0)


@pytest.mark.postgres
def test_pg_counter_sees_only_its_own_clients(pg_template: str) -> None:
    with PgCounter(PG_URL) as counter, psycopg.connect(PG_URL, autocommit=True) as direct:
        direct.execute("SELECT 1")
        assert counter.snapshot().round_trips == 0


def test_sqlite_counting_counts_statements_and_durable_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "db.sqlite")
    with sqlite_counting(path) as trace:
        conn = sqlite3.connect(path, isolation_level=None)
        other = sqlite3.connect(str(tmp_path / "other.sqlite"), isolation_level=None)
        try:
            conn.execute("CREATE TABLE t (i INTEGER)")  # autocommit: its own durable commit
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("COMMIT")
            conn.execute("BEGIN")
            conn.execute("SELECT * FROM t").fetchall()
            conn.execute("COMMIT")  # read only: no fsync
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM t")
            conn.execute("ROLLBACK")
            other.execute("CREATE TABLE u (i INTEGER)")  # another file: not counted
        finally:
            conn.close()
            other.close()
    counts = trace.snapshot()
    assert (counts.statements, counts.commits, counts.durable) == (10, 3, 2)
    assert counts.connections == 1
    # Outside the block connections are not traced any more.
    sqlite3.connect(path).close()
    assert trace.snapshot().connections == 1
