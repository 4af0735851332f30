"""Case 7: a worker process's resident memory over many runs.

The bench admits M five-step runs, starts one `python -m keel worker --stop-when-idle
--concurrency 8` and samples its RSS (psutil) together with the number of completed runs
until it exits.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

import psycopg

from bench import memory_footprint
from bench.case_drain import keel_workers
from bench.common import CaseResult, Databases, Settings, Table


def _completed(url: str) -> int:
    sql = "SELECT COUNT(*) FROM keel_runs WHERE status = 'completed'"
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)
        try:
            return int(conn.execute(sql).fetchone()[0])
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        row = pg.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _at(samples: list[tuple[int, int]], runs: int) -> int | None:
    """RSS of the first sample taken once `runs` runs had completed."""
    for done, rss in samples:
        if done >= runs:
            return rss
    return None


def run(settings: Settings, dbs: Databases) -> CaseResult:
    result = CaseResult(
        "memory",
        "7. Worker memory over many runs",
        "M five-step runs admitted up front, drained by one worker process (`python -m keel "
        "worker bench.workloads:app --stop-when-idle --concurrency 8`); its RSS is sampled with "
        "psutil every 0.25 s next to the count of completed runs. The issue asks for 10,000 "
        "runs; that does not fit this bench's time budget on 2 cores, so M is "
        + ", ".join(f"{m:,} on {b}" for b, m in settings.memory_runs.items())
        + "; growth is read from 10% of M (after warm-up) to the end. "
        "Footprint (second table): one worker (`--concurrency "
        f"{settings.memory_inflight}`, no --stop-when-idle) on a fresh database, RSS the "
        "median of 5 samples 0.2 s apart: idle once it has registered; with "
        f"{settings.memory_inflight} runs in flight, each awaiting `asyncio.sleep` in its only "
        f"node; after it drove {settings.memory_waiting:,} approval runs to their wait. Then it "
        "is stopped (SIGTERM) and a fresh worker starts on the same database: its RSS minus "
        f"the first one's idle RSS, divided by {settings.memory_waiting:,}, is what a waiting "
        "run costs a worker.",
    )
    try:
        import psutil
    except ImportError:
        result.notes.append("psutil is not installed (pip install -e '.[bench]'): not measured.")
        return result
    rows = []
    for backend in settings.backends:
        m = settings.memory_runs[backend]
        url = dbs.keel(backend, "memory")
        app = dbs.app(url)
        try:
            prefix = f"mem-{uuid.uuid4().hex[:6]}"
            for i in range(m):
                app.submit("chain5", job_id=f"{prefix}-{i}", input={"n": 0})
        finally:
            app.close()
        (proc,), logs = keel_workers(url, dbs, 1)
        ps = psutil.Process(proc.pid)
        samples: list[tuple[int, int]] = []
        start = time.perf_counter()
        while proc.poll() is None:
            try:
                rss = ps.memory_info().rss
            except psutil.NoSuchProcess:
                break
            samples.append((_completed(url), rss))
            time.sleep(0.25)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"memory worker failed:\n{logs[0].read_text()[-2000:]}")
        done = _completed(url)
        if done != m:
            raise RuntimeError(f"memory case: {done} of {m} runs completed")
        early = _at(samples, max(1, m // 10))
        mid = _at(samples, m // 2)
        # The first sample with every run done: later ones catch the process shutting down.
        last = _at(samples, m) or (samples[-1][1] if samples else None)
        at_1000 = _at(samples, 1000) if m > 1000 else None
        growth = (last - early) / early * 100 if early and last else float("nan")

        def mb(value: Any) -> str:
            return "n/a" if value is None else f"{value / 2**20:.1f}"

        rows.append(
            [
                backend,
                f"{m:,}",
                f"{m / elapsed:.1f}",
                mb(early),
                mb(at_1000),
                mb(mid),
                mb(last),
                f"{growth:+.1f}%",
            ]
        )
        result.data[backend] = samples
        result.figures[f"{backend}.rss_growth_pct"] = growth
        result.figures[f"{backend}.memory_runs"] = m
    result.tables.append(
        Table(
            "Worker RSS over runs (MiB)",
            [
                "backend",
                "runs",
                "runs/s (with start-up)",
                "at 10%",
                "at run 1,000",
                "at 50%",
                "at the end",
                "growth 10% → end",
            ],
            rows,
        )
    )
    result.tables.append(_footprint(settings, dbs, result))
    return result


def _footprint(settings: Settings, dbs: Databases, result: CaseResult) -> Table:
    inflight, waiting = settings.memory_inflight, settings.memory_waiting
    rows = []
    for backend in settings.backends:
        f = memory_footprint.measure(settings, dbs, backend)
        per_flight = (f["inflight"] - f["idle"]) / inflight
        per_wait = (f["fresh_waiting"] - f["idle"]) / waiting
        rows.append(
            [
                backend,
                f"{f['idle'] / 2**20:.1f}",
                f"{f['inflight'] / 2**20:.1f}",
                f"{per_flight / 2**10:.0f}",
                f"{f['after_waits'] / 2**20:.1f}",
                f"{f['fresh_waiting'] / 2**20:.1f}",
                f"{per_wait:,.0f}",
            ]
        )
        result.data[f"{backend}.footprint"] = f
        result.data["footprint_sizes"] = (inflight, waiting)
        result.figures[f"{backend}.rss_idle_mib"] = f["idle"] / 2**20
        result.figures[f"{backend}.rss_per_inflight_kib"] = per_flight / 2**10
        result.figures[f"{backend}.rss_per_waiting_bytes"] = per_wait
    return Table(
        "Worker footprint: idle, runs in flight, runs waiting",
        [
            "backend",
            "idle MiB",
            f"{inflight} in flight MiB",
            "KiB per run in flight",
            f"after {waiting:,} runs to their wait MiB",
            f"fresh worker, {waiting:,} waiting MiB",
            "bytes per waiting run",
        ],
        rows,
        "Bytes per waiting run: (fresh worker with the waits - first worker idle) / waits; "
        "both are fresh processes that have run no graph yet, so the difference is what the "
        "waits cost to hold. Two interpreters differ by a few hundred KiB anyway: at "
        f"{waiting:,} waits, ±{200 * 1024 // waiting:,} bytes per run is noise.",
    )
