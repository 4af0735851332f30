"""Case 15: cost as runs accumulate: finished runs kept, runs waiting for a decision.

Each level is its own database holding a history: `SEED` real runs (the 5-node chain to its
end, or the approval graph to its wait), then every row those runs wrote in every table that
names a run or a thread (Keel's runs, events and waits; LangGraph's checkpoints, writes and
blobs) cloned under new ids until the level's count is reached, then ANALYZE: a history shaped
like a real one, without executing 100,000 runs. On each level a standing in-process worker
then executes new 5-node runs (timed from submit to `finished_at`, as in case 1), one per level
per round, interleaved; then, with the workers stopped, the rows PostgreSQL reads per run are
counted on each level, and a claim of a queued run is timed alone (`leases.claim`), one per
level per round (counted before those claims: each leaves its run running under a live lease).
Then a worker process's RSS on the level without waiting runs and on the one with the most.
Last, four idle workers on the database with the most waiting runs: their traffic per second,
counted as case 10 counts one.
"""

from __future__ import annotations

import sqlite3
import time
import uuid

import psycopg

from bench.case_drain import keel_workers
from bench.common import CaseResult, Databases, Settings, Summary, Table, interleave
from bench.runners import BenchError, KeelRunner
from bench.wire import PgCounter, sqlite_counting
from keel.core import leases

SEED = 20
"""Real runs per level; the rest of its history is their rows, cloned."""
RENAMED = ("run_id", "thread_id", "job_id", "wait_id")
"""Columns that make a cloned row another run's (suffixed `~N`)."""


def _tables(url: str) -> dict[str, list[str]]:
    """Every table with a run or thread column, and the columns a clone copies (identity and
    rowid columns left to the database)."""
    found: dict[str, list[str]] = {}
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            names = [
                r[0]
                for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                if not r[0].startswith("sqlite_")
            ]
            for name in names:
                cols = db.execute(f'PRAGMA table_info("{name}")').fetchall()
                # An INTEGER PRIMARY KEY alone is the rowid: numbered anew.
                pks = [c for c in cols if c[5]]
                auto = {c[1] for c in pks if len(pks) == 1 and c[2].upper() == "INTEGER"}
                names_ = [c[1] for c in cols if c[1] not in auto]
                if {"run_id", "thread_id"} & set(names_):
                    found[name] = names_
        return found
    with psycopg.connect(url) as db:
        rows = db.execute(
            "SELECT c.table_name, c.column_name, c.is_identity FROM information_schema.columns c"
            " JOIN information_schema.tables t USING (table_schema, table_name)"
            " WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'"
            " ORDER BY c.table_name, c.ordinal_position"
        ).fetchall()
    by_table: dict[str, list[str]] = {}
    for table, column, identity in rows:
        if identity != "YES":
            by_table.setdefault(table, []).append(column)
    return {t: cols for t, cols in by_table.items() if {"run_id", "thread_id"} & set(cols)}


def _names(cols: list[str]) -> str:
    return ", ".join(f'"{c}"' for c in cols)


def clone_history(url: str, copies: int) -> None:
    """Every run-scoped row, `copies` more times under new ids; then fresh planner statistics."""
    if copies <= 0:
        return
    tables = _tables(url)
    sqlite = url.startswith("sqlite:")

    def select(cols: list[str]) -> str:
        return ", ".join(f"t.\"{c}\" || '~' || s.n" if c in RENAMED else f't."{c}"' for c in cols)

    if sqlite:
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            # Keel's triggers (webhooks) call keel_now(), which SQLite resolves when it
            # prepares the INSERT even if no trigger fires: the runtime's clock, here too.
            db.create_function("keel_now", 0, time.time)
            for table, cols in tables.items():
                db.execute(
                    f"WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?)"
                    f' INSERT INTO "{table}" ({_names(cols)})'
                    f' SELECT {select(cols)} FROM "{table}" AS t, s',
                    (copies,),
                )
            db.execute("ANALYZE")
        return
    with psycopg.connect(url, autocommit=True) as db:
        for table, cols in tables.items():
            db.execute(
                f'INSERT INTO "{table}" ({_names(cols)})'
                f' SELECT {select(cols)} FROM "{table}" AS t,'
                " generate_series(1, %s) AS s(n)",
                (copies,),
            )
        db.execute("VACUUM ANALYZE")


def seed(dbs: Databases, url: str, finished: int, waiting: int) -> None:
    """`finished` completed 5-node runs and `waiting` approval runs waiting for a decision."""
    parts = [("chain5", finished, "finished"), ("approval", waiting, "waiting")]
    for workflow, count, ending in parts:
        if not count:
            continue
        runner = KeelRunner(dbs, url)
        try:
            runner.submit(workflow, [{"n": 0}] * min(SEED, count))
            runner.drain(min(SEED, count), ending)
        finally:
            runner.close()
    # Each level seeds one kind at a time from its SEED real runs.
    real = sum(min(SEED, c) for _, c, _ in parts if c)
    total = finished + waiting
    clone_history(url, total // real - 1)


def _count(dbs: Databases, url: str) -> dict[str, int]:
    app = dbs.app(url)
    try:
        found: dict[str, int] = {}
        for status in ("completed", "waiting"):
            found[status] = len(app.list_runs(status=status, limit=1_000_000))
        return found
    finally:
        app.close()


def run(settings: Settings, dbs: Databases) -> CaseResult:
    levels: dict[str, tuple[int, int]] = settings.accumulate_levels
    rounds = settings.accumulate_rounds
    result = CaseResult(
        "accumulate",
        "15. Cost as runs accumulate: finished runs kept, runs waiting",
        (__doc__ or "").split("\n\n", 1)[1].replace("\n", " ").strip()
        + f" {rounds} measured rounds after 2 warm-up rounds; levels: "
        + ", ".join(levels)
        + ".",
    )
    run_rows: list[list[str]] = []
    idle_rows: list[list[str]] = []
    rss_rows: list[list[str]] = []
    for backend in settings.backends:
        urls: dict[str, str] = {}
        seeded: dict[str, float] = {}
        for label, (finished, waiting) in levels.items():
            url = dbs.keel(backend, f"acc_{label}")
            t = time.perf_counter()
            seed(dbs, url, finished, waiting)
            seeded[label] = time.perf_counter() - t
            urls[label] = url
        counts = {label: _count(dbs, url) for label, url in urls.items()}
        runners = {label: KeelRunner(dbs, url, lease_ttl=3600) for label, url in urls.items()}
        try:
            for r in runners.values():
                r.start_worker()
            per_run = interleave(
                {
                    label: (lambda _r, k=r: k.one("chain5", {"n": 0}))
                    for label, r in runners.items()
                },
                rounds,
                warmup=2,
            )
        finally:
            for r in runners.values():
                r.close()
        # Counted with no other client open, and before the timed claims: each leaves its run
        # running under a live lease, and a claim reads every such run looking for an expired
        # one (docs/benchmarks.md, section 15), which is not this column's question.
        reads = {
            label: _rows_read_per_run(dbs, url, settings) if backend == "postgres" else None
            for label, url in urls.items()
        }
        claimers = {label: KeelRunner(dbs, url, lease_ttl=3600) for label, url in urls.items()}
        try:
            claims = interleave(
                {label: (lambda _r, k=r: _claim(k)) for label, r in claimers.items()},
                rounds,
                warmup=2,
            )
        finally:
            for r in claimers.values():
                r.close()
        base = next(iter(levels))
        most_waiting = max(levels, key=lambda k: levels[k][1])
        rss = {label: _worker_rss(dbs, urls[label], settings) for label in (base, most_waiting)}
        low, high = rss[base], rss[most_waiting]
        if low is not None and high is not None:
            waiting = counts[most_waiting]["waiting"] - counts[base]["waiting"]
            per_waiting = (high - low) / max(1, waiting)
            result.figures[f"{backend}.rss_per_waiting_run"] = per_waiting
            for label, got in ((base, low), (most_waiting, high)):
                rss_rows.append(
                    [backend, label, f"{counts[label]['waiting']:,}", f"{got / 2**20:.1f}"]
                    + ([f"{per_waiting:+.0f}"] if label == most_waiting else ["-"])
                )
        for label in levels:
            run_s = Summary.of(per_run[label])
            claim_s = Summary.of(claims[label])
            run_rows.append(
                [
                    backend,
                    label,
                    f"{counts[label]['completed']:,} / {counts[label]['waiting']:,}",
                    run_s.scaled(1e3).fmt(2),
                    f"{run_s.median / Summary.of(per_run[base]).median:.2f}",
                    claim_s.scaled(1e3).fmt(3),
                    f"{claim_s.median / Summary.of(claims[base]).median:.2f}",
                    "-" if reads[label] is None else f"{reads[label]:.0f}",
                    f"{seeded[label]:.0f} s",
                ]
            )
            result.figures[f"{backend}.run_vs_base.{label}"] = (
                run_s.median / Summary.of(per_run[base]).median
            )
            result.figures[f"{backend}.claim_vs_base.{label}"] = (
                claim_s.median / Summary.of(claims[base]).median
            )
        idle_rows.append([backend, most_waiting, *_idle(dbs, urls[most_waiting], settings)])
        for url in urls.values():
            dbs.drop(url)
    result.tables.append(
        Table(
            "Per-run and per-claim time by history",
            [
                "backend",
                "level",
                "completed / waiting runs",
                "ms per 5-node run",
                "run vs first level",
                "ms per claim",
                "claim vs first level",
                "PG rows read per run",
                "seeding took",
            ],
            run_rows,
            "Target (issue 34): flat, ≤ 1.2x from the smallest level to the largest. PG rows "
            "read per run: the rows PostgreSQL's scans returned (pg_stat_user_tables "
            f"seq_tup_read + idx_tup_fetch) over {READ_RUNS} runs in a row on that level by a "
            "worker of their own (its connections closed before counting, so every backend "
            "reported), less what a worker started and stopped with no run reads, per run, "
            "counted before the timed claims (no run left under a live lease): "
            "load does not move it, and a query that reads more as history "
            "grows shows here.",
        )
    )
    if rss_rows:
        result.tables.append(
            Table(
                "Worker RSS beside waiting runs",
                ["backend", "level", "waiting runs", "worker RSS (MiB)", "bytes per waiting run"],
                rss_rows,
                "Target (issue 34): ≈ 0 bytes per waiting run. One worker process (`python -m "
                f"keel worker`) per level executes {RSS_RUNS} 5-node runs, then its RSS (psutil) "
                "is read after a stranded-run check has passed; bytes per waiting run: the "
                "difference between the two levels over the difference in waiting runs (a "
                "process's RSS moves by a MiB or so from one start to the next: that is the "
                "noise).",
            )
        )
    result.tables.append(
        Table(
            "Four idle workers beside the waiting runs, per second",
            ["backend", "level", "requests/s (all four)", "transactions/s (wrote)"],
            idle_rows,
            "Target (issue 34): ≤ 1 round trip per second per idle worker (PostgreSQL).",
        )
    )
    return result


def _claim(runner: KeelRunner) -> float:
    """Seconds of one claim of one queued run (admitted first, not timed)."""
    app = runner.app
    app.submit("chain5", job_id=f"claim-{time.perf_counter_ns()}", input={"n": 0})
    rt = app.aio.runtime

    async def claim() -> float:
        start = time.perf_counter()
        got = await leases.claim(rt.store, "bench-claimer", rt.workflows.keys(), 3600)
        took = time.perf_counter() - start
        if got is None:
            raise BenchError("the timed claim found nothing")
        return took

    return float(rt.portal.call(claim()))


READ_RUNS = 20


def _pg_rows_read(url: str) -> int:
    """Rows PostgreSQL's scans have returned on this database so far, once the backends'
    statistics stop moving (they report lazily, at most once a second)."""

    def read() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(seq_tup_read), 0) + COALESCE(SUM(idx_tup_fetch), 0)"
                " FROM pg_stat_user_tables"
            ).fetchone()
        return int(row[0]) if row else 0

    last = read()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(1.2)
        now = read()
        if now == last:
            break
        last = now
    return last


def _rows_read_per_run(dbs: Databases, url: str, settings: Settings) -> float:
    """Rows read per 5-node run on this database, by a worker of its own whose connections
    are closed before counting (a backend reports its statistics for sure as it exits)."""
    runs = 4 if settings.quick else READ_RUNS
    read: list[int] = []
    for count in (0, runs):  # the difference cancels the worker's own start and stop
        before = _pg_rows_read(url)
        runner = KeelRunner(dbs, url)
        try:
            runner.start_worker()
            for _ in range(count):
                runner.one("chain5", {"n": 0})
        finally:
            runner.close()
        read.append(_pg_rows_read(url) - before)
    return (read[1] - read[0]) / runs


RSS_RUNS = 20


def _worker_rss(dbs: Databases, url: str, settings: Settings) -> int | None:
    """Resident bytes of a worker process on this database, once it has executed RSS_RUNS
    5-node runs and looked for stranded runs (it does when it starts); None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    runs = 4 if settings.quick else RSS_RUNS
    (proc,), logs = keel_workers(url, dbs, 1, stop_when_idle=False)
    app = dbs.app(url)
    try:
        prefix = f"rss-{uuid.uuid4().hex[:6]}"
        ids = [
            app.submit("chain5", job_id=f"{prefix}-{i}", input={"n": 0})["run_id"]
            for i in range(runs)
        ]
        deadline = time.monotonic() + 120
        while any(app.get_run(r).status != "completed" for r in ids):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"RSS worker: runs not completed:\n{logs[0].read_text()[-2000:]}")
            time.sleep(0.2)
        time.sleep(1.0)  # its last run's bookkeeping settled
        return int(psutil.Process(proc.pid).memory_info().rss)
    finally:
        app.close()
        proc.terminate()
        proc.wait(timeout=60)


IDLE_WORKERS = 4


def _idle(dbs: Databases, url: str, settings: Settings) -> list[str]:
    window = 2.0 if settings.quick else 10.0
    settle = 1.0 if settings.quick else 3.0
    if url.startswith("sqlite:"):
        with sqlite_counting(dbs.sqlite_path(url)) as trace:
            runners = [KeelRunner(dbs, url) for _ in range(IDLE_WORKERS)]
            try:
                for r in runners:
                    r.start_worker(observe=False)
                time.sleep(settle)
                before = trace.snapshot()
                time.sleep(window)
                c = trace.snapshot() - before
            finally:
                for r in runners:
                    r.close()
        return [
            f"{c.statements / window:.2f} statements",
            f"{c.commits / window:.2f} ({c.durable / window:.2f} wrote)",
        ]
    with PgCounter(url) as counter:
        runners = [KeelRunner(dbs, counter.url(url)) for _ in range(IDLE_WORKERS)]
        try:
            for r in runners:
                r.start_worker(observe=False)
            time.sleep(settle)
            p0 = counter.snapshot()
            time.sleep(window)
            p = counter.snapshot() - p0
        finally:
            for r in runners:
                r.close()
    return [
        f"{p.round_trips / window:.2f} round trips ({p.round_trips / window / IDLE_WORKERS:.2f}"
        " per worker)",
        f"{p.transactions / window:.2f} ({p.writing / window:.2f} wrote)",
    ]
