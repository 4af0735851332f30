"""The drain workload on DBOS: a 5-step workflow behind a DBOS queue, run in its own process.

    python -m bench.dbos_workload setup  URL
    python -m bench.dbos_workload worker URL --prefix P --expect N --index I

`setup` creates DBOS's system tables and the queue; `worker` launches DBOS (which dequeues and
runs workflows), waits until N workflows whose ids start with P have succeeded, then exits.
The bench enqueues the workflows with `DBOSClient` before starting the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from typing import Any

APP_NAME = "keel-bench"
APP_VERSION = "bench"
QUEUE = "bench"
WORKFLOW = "bench_chain5"
# DBOS's default queue poll is 1 s, which would cap a worker at `worker_concurrency` workflows per
# second; Keel's worker polls every 0.05 s when busy, so DBOS gets the same.
POLL = 0.05
CONCURRENCY = 8


def configure(url: str, executor_id: str) -> Any:
    from dbos import DBOS

    DBOS(
        config={
            "name": APP_NAME,
            "system_database_url": url,
            "application_version": APP_VERSION,
            "executor_id": executor_id,
            "log_level": "WARNING",
        }
    )

    def make_step(c: str) -> Any:
        def bump(n: int) -> int:
            return n + 1

        bump.__name__ = bump.__qualname__ = f"bench_step_{c}"
        return DBOS.step(name=bump.__name__)(bump)

    steps = [make_step(c) for c in "abcde"]

    @DBOS.workflow(name=WORKFLOW)
    def chain5(n: int) -> int:
        for step in steps:
            n = step(n)
        return n

    return DBOS


def register_queue(dbos: Any) -> None:
    dbos.register_queue(QUEUE, worker_concurrency=CONCURRENCY, polling_interval_sec=POLL)


def succeeded(url: str, prefix: str) -> tuple[int, float | None, float | None]:
    """(successful workflows, first step start, last step end) of one round; times in s."""
    # workflow_status times are whole seconds on SQLite; step times are milliseconds.
    count_sql = (
        "SELECT COUNT(*) FROM {s}workflow_status WHERE status = 'SUCCESS' AND workflow_uuid LIKE ?"
    )
    span_sql = (
        "SELECT MIN(started_at_epoch_ms), MAX(completed_at_epoch_ms) FROM {s}operation_outputs"
        " WHERE workflow_uuid LIKE ?"
    )
    like = (prefix + "%",)
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        try:
            (count,) = conn.execute(count_sql.format(s=""), like).fetchone()
            first, last = conn.execute(span_sql.format(s=""), like).fetchone()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as pg:
            counted = pg.execute(count_sql.format(s="dbos.").replace("?", "%s"), like).fetchone()
            span = pg.execute(span_sql.format(s="dbos.").replace("?", "%s"), like).fetchone()
        assert counted is not None and span is not None
        (count,), (first, last) = counted, span
    return int(count), (first / 1e3 if first else None), (last / 1e3 if last else None)


def enqueue(url: str, prefix: str, n: int) -> float:
    """Enqueue n workflows with DBOSClient; return the seconds it took."""
    from dbos import DBOSClient

    client = DBOSClient(system_database_url=url, application_name=APP_NAME)
    try:
        start = time.perf_counter()
        for i in range(n):
            client.enqueue(
                {
                    "queue_name": QUEUE,
                    "workflow_name": WORKFLOW,
                    "workflow_id": f"{prefix}-{i}",
                    "app_version": APP_VERSION,
                },
                0,
            )
        return time.perf_counter() - start
    finally:
        client.destroy()


def prepare_sqlite(url: str) -> None:
    """DBOS leaves SQLite in rollback-journal mode; use WAL, as Keel does (it persists)."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        conn.execute("PRAGMA journal_mode=WAL")
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dbos_workload")
    parser.add_argument("mode", choices=["setup", "worker"])
    parser.add_argument("url")
    parser.add_argument("--prefix", default="")
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    if args.mode == "setup" and args.url.startswith("sqlite:"):
        prepare_sqlite(args.url)
    dbos = configure(args.url, f"bench-{args.mode}-{args.index}-{os.getpid()}")
    dbos.launch()
    try:
        register_queue(dbos)
        if args.mode == "setup":
            return 0
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            count, _, _ = succeeded(args.url, args.prefix)
            if count >= args.expect:
                break
            time.sleep(0.05)
        else:
            print(f"timed out with {count}/{args.expect} workflows done", file=sys.stderr)
            return 1
        print(json.dumps({"done": count}))
        return 0
    finally:
        dbos.destroy()


if __name__ == "__main__":
    raise SystemExit(main())
