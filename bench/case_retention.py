"""Case 11: retention at scale — growth per 1,000 runs, and a pruned database flat while a
worker runs.

The workload (`retained`, registered here) is a two-step run: one effect, then a 2 KiB
artifact, the shape of a run that leaves a report behind.

1. **Growth.** 1,000 runs (100 with --quick) drained by an in-process worker; the database and
   the artifacts folder are measured before, after, and after `prune` deleted them all. SQLite
   is measured as the operating system sees it (main file plus WAL, after a checkpoint) and
   by its used pages; PostgreSQL by `pg_database_size`, with autovacuum left to itself.
2. **Flat under load.** One worker (`concurrency=4`) with a scheduled prune
   (`prune_older_than`, every `prune_interval` seconds: the worker option behind `keel worker
   --prune-older-than`) executes 10,000 runs (1,000 with --quick) that are submitted while it
   runs, in batches that keep the queue short. Every 1,000 runs the sizes are read. No VACUUM
   is ever run: SQLite reuses the pages a prune freed (its freelist) and PostgreSQL reuses
   the space autovacuum reclaims, so the files stop growing once the retention window is full.

`python -m bench --cases retention` runs it; besides its section of the bench report it writes
its tables to bench/results/retention.md (docs/operations.md quotes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, TypedDict

import psycopg
from langgraph.graph import END, START, StateGraph

import keel
from bench.common import REPO, CaseResult, Databases, Settings, Table, pg_dbname
from keel.runtime.worker import Worker

WORKFLOW = "retained"
OUT = REPO / "bench" / "results" / "retention.md"
ARTIFACT = "x" * 2048


class State(TypedDict, total=False):
    n: int
    report: str


@keel.effect("retention_touch")
def touch(n: int, *, idempotency_key: str) -> dict[str, int]:
    return {"n": n}


def _work(state: State) -> dict[str, Any]:
    touch(state.get("n", 0))
    return {"n": state.get("n", 0) + 1}


def _report(state: State) -> dict[str, Any]:
    keel.artifacts().write_text("report.txt", ARTIFACT)
    return {"report": "report.txt"}


def retained() -> StateGraph:
    g = StateGraph(State)
    g.add_node("work", _work)
    g.add_node("report", _report)
    g.add_edge(START, "work")
    g.add_edge("work", "report")
    g.add_edge("report", END)
    return g


# -- measuring ---------------------------------------------------------------------------------


def _folder_bytes(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):  # removed by a concurrent prune
                total += os.path.getsize(os.path.join(folder, name))
    return total


def sizes(dbs: Databases, url: str, artifacts: Path, *, checkpoint: bool) -> dict[str, int]:
    """Bytes now: `db` (SQLite: main file + WAL; PostgreSQL: pg_database_size), `wal` and `used`
    (SQLite: the WAL file, pages in use), `autovacuums` (PostgreSQL: autovacuum runs on Keel's
    and LangGraph's tables so far), `artifacts`."""
    found = {"artifacts": _folder_bytes(artifacts)}
    if url.startswith("sqlite:"):
        path = dbs.sqlite_path(url)
        conn = sqlite3.connect(path, timeout=30)
        try:
            if checkpoint:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            page = conn.execute("PRAGMA page_size").fetchone()[0]
        finally:
            conn.close()
        wal = Path(path + "-wal")
        found["wal"] = wal.stat().st_size if wal.exists() else 0
        found["db"] = os.path.getsize(path) + found["wal"]
        found["used"] = (pages - free) * page
        return found
    row = dbs.admin.execute("SELECT pg_database_size(%s)", (pg_dbname(url),)).fetchone()
    found["db"] = int(row[0]) if row else 0
    with psycopg.connect(url, autocommit=True) as conn:
        count = conn.execute("SELECT sum(autovacuum_count) FROM pg_stat_user_tables").fetchone()
    found["autovacuums"] = int(count[0] or 0) if count else 0
    return found


def _app(url: str, artifacts: Path) -> keel.App:
    app = keel.App(url, artifacts_dir=artifacts)
    app.workflow(WORKFLOW)(retained)
    return app


def _drain(app: keel.App) -> None:
    rt = app.aio.runtime
    worker = Worker(rt, concurrency=4, stop_when_idle=True)
    asyncio.run_coroutine_threadsafe(worker.run(), rt.portal.loop).result(timeout=1800)


# -- part 1: growth per 1,000 runs -------------------------------------------------------------


def growth(dbs: Databases, backend: str, runs: int) -> dict[str, Any]:
    url = dbs.keel(backend, "retention_growth")
    artifacts = dbs.tmp / "retention_growth_artifacts"
    app = _app(url, artifacts)
    try:
        before = sizes(dbs, url, artifacts, checkpoint=True)
        started = time.perf_counter()
        for i in range(runs):
            app.submit(WORKFLOW, job_id=f"g-{i}", input={"n": i})
        _drain(app)
        took = time.perf_counter() - started
        after = sizes(dbs, url, artifacts, checkpoint=True)
        # Everything finished is older than a millisecond by the database's clock.
        time.sleep(0.05)
        report = app.prune(older_than=0.001)
        pruned = sizes(dbs, url, artifacts, checkpoint=True)
        vacuumed = None
        auto_vacuum = None
        if backend == "sqlite":
            conn = sqlite3.connect(dbs.sqlite_path(url), timeout=30)
            try:
                auto_vacuum = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
                conn.execute("VACUUM")
            finally:
                conn.close()
            vacuumed = sizes(dbs, url, artifacts, checkpoint=True)
    finally:
        app.close()
    return {
        "before": before,
        "after": after,
        "pruned": pruned,
        "vacuumed": vacuumed,
        "auto_vacuum": auto_vacuum,
        "deleted": report.runs,
        "runs_per_s": runs / took if took else 0.0,
    }


# -- part 2: flat while a worker runs and prunes on its schedule -------------------------------


def flat(
    dbs: Databases, backend: str, total: int, every: int, keep: float, interval: float
) -> list[dict[str, Any]]:
    url = dbs.keel(backend, "retention_flat")
    artifacts = dbs.tmp / "retention_flat_artifacts"
    app = _app(url, artifacts)
    rt = app.aio.runtime
    worker = Worker(rt, concurrency=4, prune_older_than=keep, prune_interval=interval)
    running = asyncio.run_coroutine_threadsafe(worker.run(), rt.portal.loop)
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        submitted = 0
        batch = min(200, every)
        while submitted < total:
            for i in range(submitted, min(total, submitted + batch)):
                app.submit(WORKFLOW, job_id=f"f-{i}", input={"n": i})
            submitted = min(total, submitted + batch)
            # Keep the queue short: the worker, not the backlog, sets the pace.
            while len(app.list_runs(status="queued", limit=batch)) >= batch // 2:
                time.sleep(0.2)
            if submitted % every == 0:
                _wait_finished(app, submitted)
                kept = sum(int(r["n"]) for r in app.metrics_snapshot()["runs"])
                samples.append(
                    {
                        "runs": submitted,
                        "kept": kept,
                        "s": time.perf_counter() - started,
                        **sizes(dbs, url, artifacts, checkpoint=False),
                    }
                )
    finally:
        for _ in range(2):  # drain, then stop now
            rt.portal.loop.call_soon_threadsafe(worker.stop)
        running.result(timeout=120)
        app.close()
    return samples


def _wait_finished(app: keel.App, submitted: int) -> None:
    """Until nothing is queued or running (the sample then counts `submitted` finished runs)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        busy = app.list_runs(status="queued", limit=1) or app.list_runs(status="running", limit=1)
        if not busy:
            return
        time.sleep(0.1)
    raise TimeoutError(f"runs still queued or running after {submitted} were submitted")


# -- the case ------------------------------------------------------------------------------------


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def run(settings: Settings, dbs: Databases) -> CaseResult:
    runs, total, every = (100, 1000, 200) if settings.quick else (1000, 10_000, 1000)
    keep, interval = (3.0, 1.0) if settings.quick else (10.0, 2.0)
    result = CaseResult(
        "retention",
        "11. Retention at scale",
        f"`retained` runs (one effect, then a 2 KiB artifact). Growth: {runs} runs drained, then "
        "`app.prune(older_than=0.001)` deletes them all. Flat: one worker (concurrency 4) with "
        f"`prune_older_than={keep:g}` s every {interval:g} s executes {total} runs submitted "
        f"while it runs; sizes every {every} runs, never a VACUUM. SQLite 'file' is the main "
        "file plus its WAL as the OS sees them; PostgreSQL is `pg_database_size` (autovacuum "
        "on, defaults).",
    )
    growth_rows, flat_rows = [], []
    for backend in settings.backends:
        g = growth(dbs, backend, runs)
        per_k = 1000 / runs
        b, a, p = g["before"], g["after"], g["pruned"]
        growth_rows.append(
            [
                backend,
                _mb(int((a["db"] - b["db"]) * per_k)),
                _mb(int((a.get("used", a["db"]) - b.get("used", b["db"])) * per_k)),
                _mb(int((a["artifacts"] - b["artifacts"]) * per_k)),
                _mb(a["db"]),
                _mb(p["db"]),
                _mb(p.get("used")),
                _mb(p["artifacts"]),
                _mb(g["vacuumed"]["db"]) if g["vacuumed"] else "-",
                f"{g['runs_per_s']:.0f}",
            ]
        )
        result.figures[f"{backend}.growth_db_mb_per_1000"] = (a["db"] - b["db"]) * per_k / 1e6
        result.figures[f"{backend}.growth_artifacts_mb_per_1000"] = (
            (a["artifacts"] - b["artifacts"]) * per_k / 1e6
        )
        if g["auto_vacuum"] is not None:
            result.notes.append(
                f"SQLite `PRAGMA auto_vacuum` = {g['auto_vacuum']} (0: none, the default): a "
                "prune frees pages onto the freelist, the file keeps its size until a VACUUM; "
                "later runs reuse the free pages."
            )
        samples = flat(dbs, backend, total, every, keep, interval)
        for s in samples:
            flat_rows.append(
                [
                    backend,
                    str(s["runs"]),
                    str(s["kept"]),
                    _mb(s["db"]),
                    _mb(s.get("wal")),
                    _mb(s.get("used")),
                    str(s.get("autovacuums", "-")),
                    _mb(s["artifacts"]),
                    f"{s['s']:.0f}",
                ]
            )
        half = samples[len(samples) // 2]["db"] if samples else 0
        result.figures[f"{backend}.flat_growth_second_half"] = (
            (samples[-1]["db"] - half) / half if half else 0.0
        )
        result.data[f"{backend}.flat"] = samples
    result.tables.append(
        Table(
            f"Growth per 1,000 runs, and after pruning all {runs}",
            [
                "backend",
                "file MB / 1k runs",
                "used MB / 1k runs",
                "artifacts MB / 1k runs",
                f"file after {runs}",
                "file after prune",
                "used after prune",
                "artifacts after prune",
                "file after VACUUM",
                "runs/s",
            ],
            growth_rows,
        )
    )
    result.tables.append(
        Table(
            f"Size while a pruning worker executes {total} runs (MB)",
            [
                "backend",
                "runs so far",
                "runs kept",
                "file (SQLite: main + WAL)",
                "of which WAL",
                "used pages",
                "autovacuums",
                "artifacts",
                "elapsed s",
            ],
            flat_rows,
        )
    )
    write(result, settings)
    return result


def write(result: CaseResult, settings: Settings) -> Path:
    """The case's tables on a page of their own too, the figures docs/operations.md quotes."""
    lines = [f"# {result.title}", "", result.method, ""]
    if settings.quick:
        lines += ["**Quick mode: tiny batches, figures are noise.**", ""]
    for table in result.tables:
        lines += [f"**{table.title}**", "", "| " + " | ".join(table.columns) + " |"]
        lines += ["|" + "|".join(" --- " for _ in table.columns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in table.rows] + [""]
    lines += [f"- {note}" for note in result.notes]
    lines += [f"- load average (1 min) at the end: {os.getloadavg()[0]:.1f}"]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    return OUT
