"""Case 13: tick lateness of 1,000 schedules on one PostgreSQL, and a scheduler's idle cost.

Per shape, a fresh database gets 1,000 schedules of `chain5` and two `python -m keel worker
bench.workloads:app` processes (concurrency 8) run for the window; the workers fire the ticks
and execute the runs. Lateness is each fired tick's `fired_at` minus its tick time, both by the
database's clock (`keel_schedule_ticks`, written in the transaction that admits the run). Ticks
due in the window but never fired count as missed.

- spread: 1,000 once-a-minute crons, their second field spread (`S * * * * *`, S = i mod 60):
  ~17 ticks a second, every second;
- burst: 1,000 crons on the same seconds (`*/15 * * * * *`): 1,000 ticks due at once every
  15 s, with `overlap="allow"` so a run still queued skips no tick.

Idle: one worker process, through the counting proxy (bench/wire.py), on a database holding
1,000 schedules none of which is due for hours: its round trips per second once settled.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.case_drain import keel_workers
from bench.common import CaseResult, Databases, Settings, Table
from bench.runners import BenchError
from bench.wire import PgCounter
from keel.runtime.cron import CronTiming, check_timezone

SCHEDULES = 1_000
WORKERS = 2
SHAPES: dict[str, dict[str, Any]] = {
    "spread": {"cron": lambda i: f"{i % 60} * * * * *", "overlap": "skip"},
    "burst": {"cron": lambda i: "*/15 * * * * *", "overlap": "allow"},
}


def _make(dbs: Databases, url: str, n: int, cron: Any, overlap: str) -> None:
    app = dbs.app(url)
    try:
        for i in range(n):
            app.schedules.create(
                f"s{i:04d}", "chain5", cron=cron(i), input={"n": 0}, overlap=overlap
            )
    finally:
        app.close()


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _db_now(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT keel_now()").fetchone()
    return float(row[0]) if row else 0.0


def lateness(dbs: Databases, shape: str, n: int, window: float) -> tuple[list[float], int]:
    """The lateness of each tick fired in the window (s), and how many ticks due in it were
    never fired."""
    url = dbs.keel("postgres", f"sched_{shape}")
    spec = SHAPES[shape]
    _make(dbs, url, n, spec["cron"], spec["overlap"])
    procs, logs = keel_workers(url, dbs, WORKERS, concurrency=8, stop_when_idle=False)
    try:
        time.sleep(3.0)  # interpreters start and the schedulers declare nothing (none declared)
        if any(p.poll() is not None for p in procs):
            raise BenchError(f"a worker exited early; see {logs[0]}")
        begin = _db_now(url)
        time.sleep(window)
        end = _db_now(url)
        time.sleep(2.0)  # the last ticks of the window get their chance to fire
    finally:
        _stop(procs)
    with psycopg.connect(url, autocommit=True) as conn:
        fired = {
            (str(sid), round(float(t), 3)): float(f) - float(t)
            for sid, t, f in conn.execute(
                "SELECT schedule_id, tick, fired_at FROM keel_schedule_ticks "
                "WHERE tick >= %s AND tick < %s AND outcome = 'fired'",
                (begin, end),
            ).fetchall()
        }
        schedules = conn.execute("SELECT cron, timezone FROM keel_schedules").fetchall()
    due = 0
    for cron, zone in schedules:
        timing = CronTiming(str(cron), check_timezone(str(zone)))
        tick = timing.after(begin - 0.001)
        while tick < end:
            due += 1
            tick = timing.after(tick)
    dbs.drop(url)
    return list(fired.values()), max(0, due - len(fired))


def _q(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def idle(dbs: Databases, n: int, settle: float, window: float) -> float:
    """Round trips per second of one worker over 1,000 schedules none of which is due."""
    url = dbs.keel("postgres", "sched_idle")
    _make(dbs, url, n, lambda i: f"{i % 60} {i % 24} 3 1 *", "skip")  # once a year
    with PgCounter(url) as counter:
        procs, logs = keel_workers(counter.url(url), dbs, 1, concurrency=8, stop_when_idle=False)
        try:
            time.sleep(settle)
            p0 = counter.snapshot()
            if not p0.connections or procs[0].poll() is not None:
                raise BenchError(f"the idle worker did not connect; see {logs[0]}")
            time.sleep(window)
            p = counter.snapshot() - p0
        finally:
            _stop(procs)
    dbs.drop(url)
    return p.round_trips / window


def run(settings: Settings, dbs: Databases) -> CaseResult:
    n = 100 if settings.quick else SCHEDULES
    window = 20.0 if settings.quick else 45.0
    result = CaseResult(
        "schedules",
        f"13. Schedules: tick lateness with {n:,} schedules",
        f"PostgreSQL only. Per shape a fresh database holds {n:,} schedules of `chain5` and "
        f"{WORKERS} `keel worker` processes (concurrency 8) fire their ticks and run them for "
        f"{window:.0f} s. Lateness: a fired tick's `fired_at` minus its time, both by the "
        "database's clock, in the transaction that admits its run. spread: once-a-minute crons "
        "with their second spread over the minute (~17 ticks/s); burst: every schedule on "
        "`*/15 * * * * *` (all due at once every 15 s, `overlap=allow`). Idle: one worker, "
        f"through the counting proxy, over {n:,} schedules none due for hours.",
    )
    if "postgres" not in settings.backends:
        result.notes.append("PostgreSQL was not measured: no rows.")
        return result
    rows = []
    for shape in SHAPES:
        late, missed = lateness(dbs, shape, n, window)
        if not late:
            raise BenchError(f"no tick fired in the {shape} window")
        p50, p99 = _q(late, 50), _q(late, 99)
        print(
            f"bench: schedules {shape}: p50 {p50:.3f} s, p99 {p99:.3f} s, missed {missed}",
            file=sys.stderr,
            flush=True,
        )
        rows.append(
            [
                shape,
                str(len(late)),
                str(missed),
                f"{p50 * 1e3:.0f}",
                f"{p99 * 1e3:.0f}",
                f"{max(late) * 1e3:.0f}",
                "met" if p99 < 1.0 and not missed else "**not met**",
            ]
        )
        result.figures[f"postgres.schedules_{shape}_p50_s"] = p50
        result.figures[f"postgres.schedules_{shape}_p99_s"] = p99
        result.figures[f"postgres.schedules_{shape}_missed"] = missed
    result.tables.append(
        Table(
            f"Tick lateness, {n:,} schedules, {WORKERS} workers (ms)",
            ["shape", "ticks fired", "missed", "p50", "p99", "max", "p99 < 1 s"],
            rows,
        )
    )
    per_s = idle(dbs, n, settle=10.0, window=5.0 if settings.quick else 15.0)
    result.figures["postgres.schedules_idle_round_trips_per_s"] = per_s
    result.tables.append(
        Table(
            "An idle worker's traffic with schedules",
            ["schedules", "round trips/s"],
            [[f"{n:,}", f"{per_s:.2f}"]],
            "Every round trip on every connection of the worker (its pool and LISTEN "
            "connection), claim loop and scheduler together; compare case 10 (no schedules).",
        )
    )
    return result
