"""Case 8, the floor: what one durable commit costs on each backend.

SQLite: WAL, synchronous=FULL, `BEGIN IMMEDIATE; INSERT; COMMIT` (the fsync of the WAL is the
cost). PostgreSQL: synchronous_commit=on, one autocommitted INSERT per commit (the WAL flush).
Every other figure can be divided by this one to read it in commits.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg

from bench.common import CaseResult, Databases, Settings, Summary, Table, interleave


def _sqlite_floor(path: str, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS floor (i INTEGER, v TEXT)")
        start = time.perf_counter()
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor VALUES (?, ?)", (i, "x" * 64))
            conn.execute("COMMIT")
        return (time.perf_counter() - start) / n
    finally:
        conn.close()


def _pg_floor(conn: psycopg.Connection[Any], n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        conn.execute("INSERT INTO floor VALUES (%s, %s)", (i, "x" * 64))
    return (time.perf_counter() - start) / n


def measure(backend: str, dbs: Databases, n: int) -> float:
    """ms per durable commit, one batch of n: for a case run without the floor case."""
    url = dbs.new(backend, "floor_inline")
    if backend == "sqlite":
        return _sqlite_floor(dbs.sqlite_path(url), n) * 1e3
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor (i INTEGER, v TEXT)")
        _pg_floor(conn, max(1, n // 10))  # warm the connection and the table
        ms = _pg_floor(conn, n) * 1e3
    dbs.drop(url)
    return ms


def pg_parallel(dbs: Databases, clients: int, seconds: float) -> float:
    """Durable commits/s of `clients` connections committing at once (each its own thread).

    PostgreSQL flushes the WAL once for every commit waiting at that moment (group commit), so
    this, not 1 / floor, is what the database allows workers that commit concurrently.
    """
    import threading

    url = dbs.new("postgres", "floor_parallel")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor (i INTEGER, v TEXT)")
    conns = [psycopg.connect(url, autocommit=True) for _ in range(clients)]
    counts = [0] * clients
    go = threading.Event()
    deadline = [0.0]

    def client(i: int) -> None:
        go.wait()
        while time.perf_counter() < deadline[0]:
            conns[i].execute("INSERT INTO floor VALUES (%s, %s)", (i, "x" * 64))
            counts[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    try:
        for t in threads:
            t.start()
        start = time.perf_counter()
        deadline[0] = start + seconds
        go.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    finally:
        for c in conns:
            c.close()
        dbs.drop(url)
    return sum(counts) / elapsed


def run(settings: Settings, dbs: Databases) -> CaseResult:
    result = CaseResult(
        "floor",
        "Floor: one durable commit",
        "A loop of one-row write transactions, nothing else: SQLite in WAL mode with "
        "`synchronous=FULL` (`BEGIN IMMEDIATE; INSERT; COMMIT`), PostgreSQL with "
        "`synchronous_commit=on` (one autocommitted `INSERT`). "
        f"{settings.floor_commits} commits per round, rounds interleaved across backends.",
    )
    variants: dict[str, Any] = {}
    closers = []
    if "sqlite" in settings.backends:
        path = dbs.new("sqlite", "floor").removeprefix("sqlite:///")
        variants["sqlite"] = lambda r: _sqlite_floor(path, settings.floor_commits)
    if "postgres" in settings.backends:
        url = dbs.new("postgres", "floor")
        conn = psycopg.connect(url, autocommit=True)
        conn.execute("CREATE TABLE floor (i INTEGER, v TEXT)")
        closers.append(conn.close)
        settings_row = conn.execute(
            "SELECT current_setting('synchronous_commit'), current_setting('fsync'),"
            " current_setting('wal_sync_method')"
        ).fetchone()
        result.notes.append(
            "PostgreSQL settings: synchronous_commit={}, fsync={}, wal_sync_method={}.".format(
                *(settings_row or ("?", "?", "?"))
            )
        )
        variants["postgres"] = lambda r: _pg_floor(conn, settings.floor_commits)
    try:
        series = interleave(variants, settings.rounds)
    finally:
        for close in closers:
            close()
    rows = []
    for backend, values in series.items():
        summary = Summary.of([v * 1e3 for v in values])
        result.figures[f"{backend}.floor_ms"] = summary.median
        result.data[backend] = summary
        rows.append([backend, summary.fmt(3, " ms"), f"{1 / summary.median * 1e3:,.0f}"])
    result.tables.append(
        Table("Durable commit cost", ["backend", "ms per commit", "commits/s (median)"], rows)
    )
    return result
