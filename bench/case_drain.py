"""Case 4: drain a queue of five-step runs with 1, 2 (and 4) worker processes, Keel and DBOS.

Keel: the bench admits the runs (`app.submit`), then starts `python -m keel worker
bench.workloads:app --stop-when-idle --concurrency 8` processes. DBOS: the bench enqueues the
same number of 5-step workflows with `DBOSClient`, then starts `python -m bench.dbos_workload
worker` processes (queue with worker_concurrency=8, polled every 0.05 s). Throughput is runs /
(last completion - first start), read from each system's own tables; the wall time from
starting the processes to their exit (interpreter start included) is shown too. Beside them,
the rate the database alone would allow: commits/s at the floor (one durable commit at a time)
divided by the durable commits a run's execution makes (counted, bench/wire.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import case_floor
from bench.common import (
    REPO,
    CaseResult,
    Databases,
    Settings,
    Summary,
    Table,
    interleave,
    pg_counters,
)
from bench.drain_curve import busy_since, cpu_times, execution_commits, saturation
from bench.drain_curve import workers as _workers

CONCURRENCY = 8


@dataclass
class Drained:
    runs: int
    window: float  # first start -> last completion, s
    wall: float  # processes started -> all exited, s
    enqueue: float  # s to admit/enqueue all runs
    commits: float | None = None  # per run (PostgreSQL xact_commit)
    cpu: float | None = None  # share of the machine's CPU time busy while the workers ran

    @property
    def rate(self) -> float:
        return self.runs / self.window if self.window > 0 else float("nan")


def _env(url: str, dbs: Databases) -> dict[str, str]:
    env = dict(os.environ)
    env["KEEL_DATABASE_URL"] = url
    env["KEEL_ARTIFACTS_DIR"] = str(dbs.tmp / "artifacts")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _wait_all(procs: list[subprocess.Popen[bytes]], logs: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for proc, log in zip(procs, logs, strict=True):
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise RuntimeError(f"a worker did not finish in {timeout:.0f} s; see {log}") from None
        if code != 0:
            tail = log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"worker exited with {code}:\n{tail}")


def keel_workers(
    url: str,
    dbs: Databases,
    count: int,
    concurrency: int = CONCURRENCY,
    stop_when_idle: bool = True,
    extra_env: dict[str, str] | None = None,
) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    """Start `count` Keel worker processes on `url`."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    for i in range(count):
        log = dbs.tmp / f"keel-worker-{uuid.uuid4().hex[:6]}-{i}.log"
        logs.append(log)
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "keel",
                        "worker",
                        "bench.workloads:app",
                        *(["--stop-when-idle"] if stop_when_idle else []),
                        "--concurrency",
                        str(concurrency),
                    ],
                    cwd=REPO,
                    env={**_env(url, dbs), **(extra_env or {})},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs, logs


def drain_keel(url: str, dbs: Databases, n: int, workers: int) -> Drained:
    prefix = f"drain-{uuid.uuid4().hex[:8]}"
    app = dbs.app(url)
    try:
        start = time.perf_counter()
        for i in range(n):
            app.submit("chain5", job_id=f"{prefix}-{i}", input={"n": 0})
        enqueue = time.perf_counter() - start
    finally:
        app.close()
    before = pg_counters(dbs, url) if url.startswith("postgresql:") else None
    start = time.perf_counter()
    cpu = cpu_times()
    procs, logs = keel_workers(url, dbs, workers)
    _wait_all(procs, logs, timeout=600)
    wall = time.perf_counter() - start
    busy = busy_since(cpu)
    commits = None
    if before is not None:
        commits = (pg_counters(dbs, url) - before).xact_commit / n
    app = dbs.app(url)
    try:
        rows = []
        offset = 0
        while True:
            page = app.list_runs(workflow="chain5", limit=500, offset=offset)
            rows += [r for r in page if str(r["job_id"]).startswith(prefix)]
            if len(page) < 500:
                break
            offset += 500
    finally:
        app.close()
    done = [r for r in rows if r["status"] == "completed"]
    if len(done) != n:
        raise RuntimeError(f"Keel drain: {len(done)} of {n} runs completed")
    window = max(float(r["finished_at"]) for r in done) - min(float(r["started_at"]) for r in done)
    return Drained(n, window, wall, enqueue, commits, busy)


def setup_dbos(url: str, dbs: Databases) -> None:
    log = dbs.tmp / "dbos-setup.log"
    with log.open("wb") as out:
        code = subprocess.call(
            [sys.executable, "-m", "bench.dbos_workload", "setup", url],
            cwd=REPO,
            env=_env(url, dbs),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
    if code != 0:
        raise RuntimeError(f"DBOS setup failed:\n{log.read_text(errors='replace')[-2000:]}")


def drain_dbos(url: str, dbs: Databases, n: int, workers: int) -> Drained:
    from bench import dbos_workload

    prefix = f"drain-{uuid.uuid4().hex[:8]}"
    enqueue = dbos_workload.enqueue(url, prefix, n)
    before = pg_counters(dbs, url) if url.startswith("postgresql:") else None
    procs, logs = [], []
    start = time.perf_counter()
    cpu = cpu_times()
    for i in range(workers):
        log = dbs.tmp / f"dbos-worker-{prefix}-{i}.log"
        logs.append(log)
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.dbos_workload",
                        "worker",
                        url,
                        "--prefix",
                        prefix,
                        "--expect",
                        str(n),
                        "--index",
                        str(i),
                    ],
                    cwd=REPO,
                    env=_env(url, dbs),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    _wait_all(procs, logs, timeout=600)
    wall = time.perf_counter() - start
    busy = busy_since(cpu)
    commits = None
    if before is not None:
        commits = (pg_counters(dbs, url) - before).xact_commit / n
    count, first, last = dbos_workload.succeeded(url, prefix)
    if count != n or first is None or last is None:
        raise RuntimeError(f"DBOS drain: {count} of {n} workflows succeeded")
    return Drained(n, last - first, wall, enqueue, commits, busy)


def _cpu(ds: list[Drained]) -> str:
    busy = [d.cpu * 100 for d in ds if d.cpu is not None]
    return Summary.of(busy).fmt(0, "%") if busy else "n/a"


def _ratio(a: Summary, b: Summary) -> str:
    return f"{a.median / b.median:.2f}" if a.n and b.n else "-"


def dbos_problem() -> str | None:
    """Why DBOS cannot run here, or None."""
    try:
        import dbos  # noqa: F401
    except ImportError as exc:
        return f"DBOS is not installed ({exc}); install the bench extra: pip install -e '.[bench]'"
    return None


def run(settings: Settings, dbs: Databases, floors: dict[str, float]) -> CaseResult:
    n = settings.drain_runs
    result = CaseResult(
        "drain",
        "4. Drain: a queue of five-step runs",
        f"{n} five-step runs, admitted (Keel: `app.submit`) or enqueued (DBOS: `DBOSClient."
        "enqueue`) first, then drained by worker processes with 8 concurrent runs each (Keel: "
        + "; ".join(
            f"{', '.join(map(str, w))} on {b}"
            for b, w in settings.drain_workers.items()
            if b in settings.backends
        )
        + "; DBOS: 1 and 2): "
        "`python -m keel worker bench.workloads:app --stop-when-idle --concurrency 8`, and "
        "DBOS 5-step workflows (`@DBOS.workflow` calling five `@DBOS.step`s) on a DBOS queue "
        "with `worker_concurrency=8` and a 0.05 s poll (Keel's busy poll; DBOS's default is 1 s)."
        " Runs/s = runs / (last completion - first start), from each system's own tables "
        "(Keel: runs' started_at/finished_at; DBOS: first step start to last step end, since "
        "its workflow times are whole seconds on SQLite, which favours DBOS by a few ms). "
        "Contenders interleaved, "
        + ", ".join(f"{r} round(s) on {b}" for b, r in settings.drain_rounds.items())
        + ", no warm-up round (each "
        "round starts fresh processes). On SQLite, DBOS's database is switched to WAL first "
        "(DBOS leaves it in rollback-journal mode). CPU busy: the whole machine's CPU time "
        "not idle while the workers ran (psutil; 100% = both cores). `database alone`: "
        "commits/s at the floor (case 8: one durable commit at a time) divided by the durable "
        "commits a Keel worker makes per run (its execution, admission apart: counted as in "
        "case 1, at concurrency 1). Concurrent commits share WAL flushes (group commit), so "
        "a drain can pass that line; on PostgreSQL a second line divides instead the "
        "commits/s of as many connections as the most workers run at once (8 per worker), "
        "each committing one-row inserts in a loop for a few seconds: what the database "
        "allows concurrent workers.",
    )
    problem = dbos_problem()
    if problem:
        result.notes.append(f"DBOS was not measured: {problem}.")
    rows = []
    for backend in settings.backends:
        keel_url = dbs.keel(backend, "drain_keel")
        variants: dict[str, Any] = {}
        drained: dict[str, list[Drained]] = {}

        def add(
            name: str,
            fn: Any,
            variants: dict[str, Any] = variants,
            drained: dict[str, list[Drained]] = drained,
            backend: str = backend,
        ) -> None:
            drained[name] = []

            def one(r: int) -> float:
                try:
                    d = fn()
                except Exception as exc:  # reported with the case, the other rounds go on
                    text = " ".join(str(exc).split())
                    result.notes.append(
                        f"{backend}, {name}, round {r + 1} failed and is left out: {text[-600:]}"
                    )
                    return float("nan")
                drained[name].append(d)
                return d.rate

            variants[name] = one

        for count in settings.drain_workers[backend]:
            add(
                f"Keel, {_workers(count)}",
                lambda url=keel_url, count=count: drain_keel(url, dbs, n, count),
            )
        if not problem:
            dbos_url = dbs.new(backend, "drain_dbos")
            try:
                setup_dbos(dbos_url, dbs)
            except Exception as exc:  # reported, not hidden
                result.notes.append(f"{backend}: DBOS could not be set up: {exc}")
            else:
                add("DBOS, 1 worker", lambda url=dbos_url: drain_dbos(url, dbs, n, 1))
                add("DBOS, 2 workers", lambda url=dbos_url: drain_dbos(url, dbs, n, 2))
        series = interleave(variants, settings.drain_rounds[backend], warmup=0)
        dbos_1 = Summary.of(series.get("DBOS, 1 worker", []))
        dbos_2 = Summary.of(series.get("DBOS, 2 workers", []))
        for name, values in series.items():
            rate = Summary.of(values)
            ds = drained[name]
            commits = [d.commits for d in ds if d.commits is not None]
            rows.append(
                [
                    backend,
                    name,
                    rate.fmt(1),
                    Summary.of([d.window for d in ds]).fmt(2, " s"),
                    Summary.of([d.wall for d in ds]).fmt(2, " s"),
                    Summary.of([d.enqueue / d.runs * 1e3 for d in ds]).fmt(2),
                    f"{Summary.of(commits).median:.1f}" if commits else "n/a",
                    _cpu(ds),
                    _ratio(rate, dbos_1),
                    _ratio(rate, dbos_2),
                ]
            )
            result.data[f"{backend}.{name}"] = rate
        floor_ms = floors.get(backend) or case_floor.measure(backend, dbs, settings.floor_commits)
        per_run = execution_commits(settings, dbs, keel_url)
        ceiling = 1e3 / floor_ms / per_run if per_run > 0 else float("nan")
        rows.append(
            [
                backend,
                "database alone (1 commit at a time)",
                f"{ceiling:.1f}",
                "-",
                "-",
                "-",
                f"{per_run:.1f} wrote, at {floor_ms:.2f} ms each",
                "-",
                "-",
                "-",
            ]
        )
        if backend == "postgres" and per_run > 0:
            # Workers commit concurrently, and concurrent commits share WAL flushes.
            clients = CONCURRENCY * max(settings.drain_workers[backend])
            grouped = case_floor.pg_parallel(dbs, clients, 1.0 if settings.quick else 3.0)
            result.figures[f"{backend}.db_ceiling_parallel"] = grouped / per_run
            rows.append(
                [
                    backend,
                    f"database alone ({clients} commits at a time)",
                    f"{grouped / per_run:.1f}",
                    "-",
                    "-",
                    "-",
                    f"{per_run:.1f} wrote, {grouped:,.0f} commits/s",
                    "-",
                    "-",
                    "-",
                ]
            )
        result.figures[f"{backend}.db_ceiling"] = ceiling
        result.figures[f"{backend}.exec_commits"] = per_run
        keel_rates = {
            c: Summary.of(series[f"Keel, {_workers(c)}"])
            for c in settings.drain_workers[backend]
            if series.get(f"Keel, {_workers(c)}")
        }
        keel_cpu = {
            c: Summary.of(cpus).median
            for c in keel_rates
            if (cpus := [d.cpu for d in drained[f"Keel, {_workers(c)}"] if d.cpu is not None])
        }
        result.data[f"{backend}.curve"] = {
            "Keel": keel_rates,
            "DBOS": {
                c: Summary.of(series[f"DBOS, {_workers(c)}"])
                for c in (1, 2)
                if series.get(f"DBOS, {_workers(c)}")
            },
            "ceiling": ceiling,
            "ceiling_parallel": result.figures.get(f"{backend}.db_ceiling_parallel"),
        }
        if keel_rates:
            result.notes.append(
                saturation(
                    backend,
                    keel_rates,
                    keel_cpu,
                    ceiling,
                    result.figures.get(f"{backend}.db_ceiling_parallel"),
                )
            )
            best = max(rate.median for rate in keel_rates.values())
            result.figures[f"{backend}.knee_workers"] = min(
                w for w, rate in keel_rates.items() if rate.median >= 0.9 * best
            )
            result.figures[f"{backend}.keel_best_rate"] = best
        if dbos_1.n:
            result.figures[f"{backend}.keel2_vs_dbos1"] = (
                Summary.of(series["Keel, 2 workers"]).median / dbos_1.median
            )
        if dbos_2.n:
            result.figures[f"{backend}.keel2_vs_dbos2"] = (
                Summary.of(series["Keel, 2 workers"]).median / dbos_2.median
            )
        result.figures[f"{backend}.keel2_rate"] = Summary.of(series["Keel, 2 workers"]).median
    result.tables.append(
        Table(
            f"Drain of {n} runs",
            [
                "backend",
                "contender",
                "runs/s",
                "first start → last end",
                "wall (with process start)",
                "admit/enqueue ms/run",
                "commits/run",
                "CPU busy",
                "vs DBOS 1 worker",
                "vs DBOS 2 workers",
            ],
            rows,
            "Commits/run: the database's xact_commit during the drain / runs (PostgreSQL "
            "only; read-only autocommit statements count, e.g. claim polls).",
        )
    )
    return result
