"""Case 4b: a backlog drained by a `keel worker` process, beside raw LangGraph doing the same work.

Keel: the bench process admits N five-step runs (`app.submit`, then closes its App), then starts
`python -m keel worker bench.workloads:app --stop-when-idle` at the CLI's default concurrency;
ms/run = (last finished_at - first started_at) / N, from the runs' own timestamps (the worker's
interpreter start is not in it). Raw LangGraph: the same N runs, one after another in the bench
process, `ainvoke(input, config, durability="sync")` with the official async saver, a new
thread each; ms/run = elapsed / N. Contenders alternate batch by batch (A B, then B A), one
warm-up round. Traffic per run is counted apart, untimed: the same drain by an in-process
worker at the same concurrency, through bench/wire.py's counters (admission not counted).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.case_drain import _env, _wait_all, keel_workers
from bench.common import (
    CaseResult,
    Databases,
    Loop,
    Settings,
    Summary,
    Table,
    Traffic,
    interleave,
    pg_counters,
    ratios,
)
from bench.graphs import chain5
from bench.runners import BenchError, KeelRunner, RawRunner
from bench.wire import PgCounter, sqlite_counting
from keel.runtime import worker

DEFAULT_CONCURRENCY = worker.DEFAULT_CONCURRENCY
"""`keel worker`'s default `--concurrency` (another checkout's worker runs at its own)."""


def admit(dbs: Databases, url: str, n: int) -> str:
    """Queue `n` chain5 runs from this process (its App closed after); their job prefix."""
    prefix = f"ratio-{uuid.uuid4().hex[:8]}"
    app = dbs.app(url)
    try:
        for i in range(n):
            app.submit("chain5", job_id=f"{prefix}-{i}", input={"n": 0})
    finally:
        app.close()
    return prefix


def window(dbs: Databases, url: str, prefix: str, n: int) -> float:
    """Seconds from the first run's start to the last one's end, checking all `n` completed."""
    app = dbs.app(url)
    try:
        rows: list[dict[str, Any]] = []
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
        raise BenchError(f"Keel drain: {len(done)} of {n} runs completed")
    return max(float(r["finished_at"]) for r in done) - min(float(r["started_at"]) for r in done)


COMPARE_ENV = "KEEL_BENCH_COMPARE"
"""`label=path,...`: other checkouts of Keel (e.g. `git archive` of an older commit) whose
`keel worker` drains beside this one's in the same run, each on its own database: an A/B of a
change, measured side by side."""


def compared() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for item in filter(None, (os.environ.get(COMPARE_ENV) or "").split(",")):
        label, _, path = item.partition("=")
        if not (Path(path) / "keel" / "__init__.py").exists():
            raise BenchError(f"{COMPARE_ENV}: {path} is not a checkout of Keel")
        found[label.strip()] = Path(path).resolve()
    return found


def worker_from(url: str, dbs: Databases, checkout: Path) -> tuple[list[Any], list[Path]]:
    """A `keel worker` process of another checkout (its own keel and bench packages first)."""
    log = dbs.tmp / f"keel-worker-{checkout.name}-{uuid.uuid4().hex[:6]}.log"
    env = {**_env(url, dbs), "PYTHONPATH": str(checkout)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keel", "worker", "bench.workloads:app", "--stop-when-idle"],
            cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return [proc], [log]


def keel_drain(
    dbs: Databases, url: str, n: int, commits: list[float], checkout: Path | None = None
) -> float:
    """One backlog of `n` runs drained by a `keel worker` process: seconds per run."""
    prefix = admit(dbs, url, n)
    before = pg_counters(dbs, url) if url.startswith("postgresql:") else None
    if checkout is None:
        procs, logs = keel_workers(url, dbs, 1, concurrency=DEFAULT_CONCURRENCY)
    else:
        procs, logs = worker_from(url, dbs, checkout)
    _wait_all(procs, logs, timeout=600)
    if before is not None:
        commits.append((pg_counters(dbs, url) - before).xact_commit / n)
    return window(dbs, url, prefix, n) / n


def counted_drain(dbs: Databases, url: str, small: int, large: int) -> Traffic:
    """What an in-process worker at the default concurrency asks of the database per run it
    drains: the difference of two drains of `small` and `large` runs, admission not counted."""
    found: list[Traffic] = []
    for n in (small, large):
        admit(dbs, url, n)
        if url.startswith("sqlite:"):
            with sqlite_counting(url.removeprefix("sqlite:///")) as trace:
                _drain_here(dbs, url, n)
            c = trace.snapshot()
            found.append(
                Traffic(
                    "sqlite",
                    {"statements": c.statements, "commits": c.commits, "durable": c.durable},
                )
            )
        else:
            with PgCounter(url) as counter:
                _drain_here(dbs, counter.url(url), n)
                p = counter.snapshot()
            found.append(
                Traffic(
                    "postgres",
                    {
                        "round_trips": p.round_trips,
                        "pool_checks": p.pool_checks,
                        "transactions": p.transactions,
                        "durable": p.writing,
                    },
                )
            )
    return (found[1] - found[0]).scaled(1 / (large - small))


def _drain_here(dbs: Databases, url: str, n: int) -> None:
    runner = KeelRunner(dbs, url)
    try:
        stats = runner.drain_here(DEFAULT_CONCURRENCY)
    finally:
        runner.close()
    if stats.finished != n:
        raise BenchError(f"counted drain: {stats.finished} of {n} runs finished")


def _contenders(
    dbs: Databases,
    raw: RawRunner,
    keel_url: str,
    n: int,
    commits: dict[str, list[float]],
    others: dict[str, tuple[str, Path]],
) -> dict[str, Callable[[int], float]]:
    inputs = [{"n": 0}] * n
    found: dict[str, Callable[[int], float]] = {
        "raw": lambda r: raw.batch(chain5, inputs) / n,
        "keel": lambda r: keel_drain(dbs, keel_url, n, commits["keel"]),
    }
    for label, (url, checkout) in others.items():
        found[label] = functools.partial(
            lambda r, u, c, lab: keel_drain(dbs, u, n, commits[lab], c),
            u=url,
            c=checkout,
            lab=label,
        )
    return found


CHANGES = (
    "What moved this figure, each change measured against the commit before it: default "
    "concurrency 4 -> 10 (PostgreSQL 0.83 -> 0.70-0.77, SQLite 0.74 -> 0.52, side by side "
    "with `KEEL_BENCH_COMPARE`). Then, in `keel worker`, the collector's youngest generation "
    "every 10,000 allocations instead of 700 (GC time per 1,000 runs drained 0.53 -> "
    "0.10-0.16 s), a small state's blobs and writes serialized on the loop rather than in "
    "a thread, and log redaction by substring searches (17 -> 1.6 us a line): PostgreSQL "
    "7.81 -> 7.07 and 7.59 -> 7.28 ms/run (medians of five interleaved 1,000-run drains, "
    "two sittings). This case's nine-round A/Bs of the same pair did not separate them "
    "(0.80 -> 0.70 once, 0.78 -> 0.81 once; per-round spread 0.69-1.07 on this machine)."
)
"""The history behind case 4b's figure (docs/benchmarks.md shows it under the case)."""


def run(settings: Settings, dbs: Databases) -> CaseResult:
    n = settings.drain_ratio_runs
    rounds = settings.drain_ratio_rounds
    result = CaseResult(
        "drain-ratio",
        "4b. Drain ratio: a backlog drained by a worker process, beside raw LangGraph",
        f"{n} runs of the 5-node chain per batch. Keel: admitted from the bench process "
        "(`app.submit`), then drained by one `python -m keel worker bench.workloads:app "
        f"--stop-when-idle` process at the default concurrency ({DEFAULT_CONCURRENCY}); "
        "ms/run = (last `finished_at` - first `started_at`) / runs, from the runs' own "
        "timestamps, so the worker's interpreter start is not in it. Raw LangGraph: the same "
        "runs one after another in the bench process, `ainvoke(input, config, "
        'durability="sync")` with the official async saver, a new thread each; ms/run = '
        "elapsed / runs. Batches alternate (A B, then B A), 1 warm-up round, then "
        f"{rounds} measured rounds; Keel/raw is the median (min-max) of per-round ratios. "
        "Commits/run (PostgreSQL): the database's `xact_commit` over the worker process's "
        "drain / runs. Traffic per run is counted apart, untimed, on an in-process worker at "
        "the same concurrency draining a backlog (bench/wire.py; the difference of drains of "
        f"{settings.drain_ratio_count[0]} and {settings.drain_ratio_count[1]} runs, "
        "admission not counted).",
    )
    result.notes.append(CHANGES)
    rows: list[list[str]] = []
    traffic_rows: list[list[str]] = []
    others_at = compared()
    if others_at:
        result.notes.append(
            "Also measured, in the same rounds, each on its own database: "
            + "; ".join(
                f"`{label}`: the `keel worker` of {path}" for label, path in others_at.items()
            )
            + f" ({COMPARE_ENV})."
        )
    for backend in settings.backends:
        keel_url = dbs.keel(backend, "ratio_keel")
        raw_url = dbs.new(backend, "ratio_raw")
        others = {
            label: (dbs.keel(backend, f"ratio_{label}"), path) for label, path in others_at.items()
        }
        loop = Loop()
        raw = RawRunner(loop, raw_url)
        commits: dict[str, list[float]] = {name: [] for name in ("keel", *others)}
        try:
            contenders = _contenders(dbs, raw, keel_url, n, commits, others)
            series = interleave(contenders, rounds, warmup=1)
        finally:
            raw.close()
            loop.close()
        raw_s = Summary.of(series["raw"])
        rows.append([backend, "raw LangGraph", raw_s.scaled(1e3).fmt(2),
                     f"{1 / raw_s.median:.0f}" if raw_s.n else "n/a", "-", ""])  # fmt: skip
        result.data[f"{backend}.raw"] = raw_s
        for name in ("keel", *others):
            keel_s = Summary.of(series[name])
            ratio = ratios(series[name], series["raw"])
            measured = commits[name][1:]  # the warm-up round's are not counted
            rows.append(
                [
                    backend,
                    "Keel (this checkout)" if name == "keel" else f"Keel `{name}`",
                    keel_s.scaled(1e3).fmt(2),
                    f"{1 / keel_s.median:.0f}" if keel_s.n else "n/a",
                    f"{Summary.of(measured).median:.1f}" if measured else "n/a",
                    ratio.fmt(2),
                ]
            )
            key = "drain_ratio" if name == "keel" else f"drain_ratio_{name}"
            result.figures[f"{backend}.{key}"] = ratio.median
            result.data[f"{backend}.{name}"] = keel_s
        small, large = settings.drain_ratio_count
        traffic = counted_drain(dbs, dbs.keel(backend, "ratio_count"), small, large)
        if backend == "sqlite":
            traffic_rows.append(
                [
                    backend,
                    f"{traffic.get('statements'):.1f} statements",
                    f"{traffic.get('commits'):.1f} ({traffic.durable:.1f} wrote)",
                ]
            )
        else:
            traffic_rows.append(
                [
                    backend,
                    f"{traffic.get('round_trips'):.1f} round trips "
                    f"({traffic.get('pool_checks'):.1f} pool checks)",
                    f"{traffic.get('transactions'):.1f} ({traffic.durable:.1f} wrote)",
                ]
            )
        result.figures[f"{backend}.drain_commits"] = traffic.get(
            "commits" if backend == "sqlite" else "transactions"
        )
    result.tables.append(
        Table(
            f"Backlog of {n} runs: a `keel worker` process against raw LangGraph",
            ["backend", "contender", "ms/run", "runs/s", "xact_commit/run", "Keel/raw"],
            rows,
        )
    )
    result.tables.append(
        Table(
            "A draining worker's traffic per run",
            ["backend", "requests", "commits or transactions"],
            traffic_rows,
            "Counted as in case 1 (bench/wire.py) on an in-process worker at concurrency "
            f"{DEFAULT_CONCURRENCY} draining a backlog it did not admit; raw LangGraph's per "
            "run is case 1's (13 durable commits on SQLite, 14 round trips on PostgreSQL).",
        )
    )
    return result
