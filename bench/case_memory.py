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
        + "; growth is read from 10% of M (after warm-up) to the end.",
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
            "Worker RSS (MiB)",
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
    return result
