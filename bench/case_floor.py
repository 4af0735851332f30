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
