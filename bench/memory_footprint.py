"""Case 7's second table: what a worker process holds idle, with runs in flight, and per wait.

One `python -m keel worker bench.workloads:app --concurrency C` (no --stop-when-idle) on a
fresh database: its RSS once it has registered (idle); with C runs in flight, each awaiting
in its only node (the `nap` workflow); after it drove N approval runs to their wait. Then it
is stopped and a fresh worker starts on the same database, now holding N waiting runs: the
difference from the first worker's idle RSS, divided by N, is what a waiting run costs a
worker (a wait lives in the database, not in the process, so it should be about 0).
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.case_drain import keel_workers
from bench.common import Databases, Settings

SETTLE = 1.0  # s after registering: the first claim poll has run, the loop is idle


def _count(url: str, sql: str, args: tuple[Any, ...] = ()) -> int:
    if url.startswith("sqlite:"):
        import sqlite3

        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        try:
            return int(conn.execute(sql.replace("%s", "?"), args).fetchone()[0])
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(sql, args).fetchone()
    return int(row[0]) if row else 0


def _status(url: str, status: str) -> int:
    return _count(url, "SELECT COUNT(*) FROM keel_runs WHERE status = %s", (status,))


def _until(
    what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], limit: float
) -> None:
    deadline = time.monotonic() + limit
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited ({proc.returncode}) waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not reached in {limit:.0f} s")
        time.sleep(0.2)


def _rss(ps: Any, samples: int = 5) -> float:
    """Median RSS (bytes) of a few samples 0.2 s apart: one sample can catch a GC mid-way."""
    found = []
    for _ in range(samples):
        found.append(ps.memory_info().rss)
        time.sleep(0.2)
    return float(statistics.median(found))


def _start(url: str, dbs: Databases, concurrency: int, nap: float) -> subprocess.Popen[bytes]:
    (proc,), _ = keel_workers(
        url, dbs, 1, concurrency, stop_when_idle=False, extra_env={"BENCH_NAP": f"{nap:g}"}
    )
    _until(
        "the worker to register",
        lambda: _count(url, "SELECT COUNT(*) FROM keel_workers WHERE pid = %s", (proc.pid,)) > 0,
        proc,
        60,
    )
    time.sleep(SETTLE)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def measure(settings: Settings, dbs: Databases, backend: str) -> dict[str, float]:
    """RSS figures (bytes) of one backend; see the module's docstring."""
    import psutil

    inflight, waiting = settings.memory_inflight, settings.memory_waiting
    nap = 3.0 if settings.quick else 6.0
    url = dbs.keel(backend, "footprint")
    out: dict[str, float] = {}
    proc = _start(url, dbs, inflight, nap)
    try:
        ps = psutil.Process(proc.pid)
        out["idle"] = _rss(ps)
        prefix = uuid.uuid4().hex[:6]
        app = dbs.app(url)
        try:
            for i in range(inflight):
                app.submit("nap", job_id=f"nap-{prefix}-{i}", input={"n": 0})
            _until(f"{inflight} runs in flight", lambda: _status(url, "running") >= inflight,
                   proc, nap)  # fmt: skip
            out["inflight"] = _rss(ps)
            _until("the naps to end", lambda: _status(url, "completed") >= inflight, proc, 60)
            for i in range(waiting):
                app.submit("approval", job_id=f"wait-{prefix}-{i}", input={"n": 0})
        finally:
            app.close()
        _until(f"{waiting} runs waiting", lambda: _status(url, "waiting") >= waiting, proc, 300)
        out["after_waits"] = _rss(ps)
    finally:
        _stop(proc)
    # A new process: what holding N waits costs, without the history of having made them.
    proc = _start(url, dbs, inflight, nap)
    try:
        out["fresh_waiting"] = _rss(psutil.Process(proc.pid))
    finally:
        _stop(proc)
    dbs.drop(url)
    return out
