"""Case 9: database size over many runs, with and without `prune`.

Two databases per backend get the same workload: rounds of runs of the 5-node chain with one
effect (`chain5-effect`), drained by an in-process worker. The clock (a ManualClock) moves one
half a day after each round; on one database `app.prune(older_than="1d")` then deletes the runs
older than two rounds (Keel's rows, LangGraph's checkpoints and writes). Size is measured after
each round (SQLite: used pages after folding the WAL in, so freed pages count as free;
PostgreSQL: `pg_database_size` after a plain VACUUM, which makes dead rows reusable but
returns no space to the operating system). With pruning the size should stay flat after the
first rounds; without it, it grows with every run.
"""

from __future__ import annotations

import asyncio
import time

from bench.common import CaseResult, Databases, Settings, Table
from keel.core.clock import ManualClock
from keel.runtime.worker import Worker

DAY = 86400.0


def _drain(app: object) -> None:
    rt = app.aio.runtime  # type: ignore[attr-defined]
    worker = Worker(rt, concurrency=4, stop_when_idle=True)
    asyncio.run_coroutine_threadsafe(worker.run(), rt.portal.loop).result(timeout=600)


def _size(dbs: Databases, url: str) -> int:
    if not url.startswith("sqlite:"):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM")
    return dbs.size(url)


def measure(dbs: Databases, backend: str, rounds: int, per_round: int, prune: bool) -> list[int]:
    url = dbs.keel(backend, f"prune_{'on' if prune else 'off'}")
    clock = ManualClock(start=time.time())
    app = dbs.app(url, clock=clock)
    sizes = []
    try:
        for r in range(rounds):
            for i in range(per_round):
                app.submit("chain5-effect", job_id=f"r{r}-{i}", input={"n": 0})
            _drain(app)
            clock.advance(DAY / 2)
            if prune:
                app.prune(older_than="1d")
            sizes.append(_size(dbs, url))
    finally:
        app.close()
    return sizes


def run(settings: Settings, dbs: Databases) -> CaseResult:
    # 125 a round (250 before issue 12's cases) keeps `make bench` in its time budget.
    rounds, per_round = (4, 20) if settings.quick else (8, 125)
    result = CaseResult(
        "prune",
        "9. Database size with retention",
        f"{rounds} rounds of {per_round} runs of `chain5-effect` ({rounds * per_round} runs); "
        "after each round the clock moves half a day and, on the pruned database, "
        '`app.prune(older_than="1d")` deletes what finished more than two rounds ago. Size '
        "after each round (SQLite: used pages; PostgreSQL: `pg_database_size` after VACUUM).",
    )
    rows = []
    for backend in settings.backends:
        kept = measure(dbs, backend, rounds, per_round, prune=False)
        pruned = measure(dbs, backend, rounds, per_round, prune=True)
        for r, (k, p) in enumerate(zip(kept, pruned, strict=True), start=1):
            rows.append([backend, str(r * per_round), f"{k / 1e6:.2f}", f"{p / 1e6:.2f}"])
        result.figures[f"{backend}.prune_final_ratio"] = pruned[-1] / kept[-1] if kept[-1] else 0
        result.figures[f"{backend}.prune_growth_last_half"] = (
            (pruned[-1] - pruned[len(pruned) // 2]) / pruned[len(pruned) // 2]
            if pruned[len(pruned) // 2]
            else 0
        )
    result.tables.append(
        Table(
            "Database size (MB) after N runs",
            ["backend", "runs so far", "without prune", "with prune"],
            rows,
        )
    )
    return result
