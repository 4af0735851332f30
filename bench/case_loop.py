"""Cases 6b and 10: what a large state does to the worker's event loop, and an idle worker.

6b: a ticker task on the worker's own event loop wakes every millisecond and records how late
it woke; the longest delay is the longest stall every other run on that loop (its lease
renewals, its steps) suffered. Measured while runs carrying a 1 MB state execute next to runs
of the plain chain, against the same mix with a 1 KB state, for Keel (a standing worker at
concurrency 4 that drains the runs admitted before it started, so admission is not on the
worker's loop) and for raw LangGraph (the same mix under `asyncio.gather` on one loop).

10: a worker with nothing to do, on a database with no runs; its traffic is counted exactly
(bench/wire.py) over a window after it settled.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import statistics
import time
from typing import Any

from bench import graphs
from bench.case_state import blob
from bench.common import CaseResult, Databases, Loop, Settings, Summary, Table, interleave
from bench.runners import BenchError, KeelRunner, RawRunner
from bench.wire import PgCounter, sqlite_counting

STATE_RUNS = 4  # runs carrying the state, at once
PLAIN_RUNS = 8  # plain 5-node runs beside them
CONCURRENCY = 4
TICK = 0.001
WARMUP = 1  # rounds of each mix not kept


class Ticker:
    """Wakes every `TICK` s on `loop` and keeps how late each wake-up was."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.late: list[float] = []
        self._future: concurrent.futures.Future[None] | None = None

    async def _tick(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            self.late.append(max(0.0, now - last - TICK))
            last = now

    def start(self) -> None:
        self.late = []
        self._future = asyncio.run_coroutine_threadsafe(self._tick(), self.loop)

    def stop(self) -> tuple[float, float]:
        """(longest stall, 99th percentile) in ms since start()."""
        if self._future is not None:
            self._future.cancel()
            self._future = None
        if not self.late:
            return float("nan"), float("nan")
        p99 = statistics.quantiles(self.late, n=100)[98] if len(self.late) > 1 else self.late[0]
        return max(self.late) * 1e3, p99 * 1e3


def _rounds(settings: Settings) -> int:
    return 1 if settings.quick else 4


def stall(settings: Settings, dbs: Databases) -> CaseResult:
    size = max(settings.state_sizes)
    label = f"{size / 1e6:g} MB" if size >= 1_000_000 else f"{size // 1000} KB"
    result = CaseResult(
        "stall",
        f"6b. Event-loop stalls with a {label} state",
        f"{STATE_RUNS} runs of the 5-node chain whose every node rewrites a string of the "
        f"given size, each followed by {PLAIN_RUNS // STATE_RUNS} runs of the plain chain, all"
        " executing together. Keel: the runs admitted first, then an in-process worker at "
        f"concurrency {CONCURRENCY} that stops when the queue is dry (its start, connecting "
        "included, is inside the window; the bench's thread blocks on it, polling nothing); "
        "raw LangGraph: the same runs under `asyncio.gather` on one loop with the official "
        "saver. A ticker task on the loop that executes the runs (the worker's loop for Keel)"
        " sleeps 1 ms at a time and records how late it wakes; the longest delay is the "
        "longest time no other task on that loop (another run's step, a lease renewal) could "
        f"run. {_rounds(settings)} round(s) of each mix, interleaved, after one warm-up round;"
        " garbage is collected before each mix, so a collection of what an earlier mix left "
        "is not counted to this one.",
    )
    rows = []
    for backend in settings.backends:
        stalls = _stalls(settings, dbs, backend, size)
        for who, name in (("keel", "Keel"), ("raw", "raw LangGraph")):
            cells = []
            for state_size in (1_000, size):
                kept = stalls.get(f"{who}.{state_size}", [])
                longest = Summary.of([s for s, _ in kept])
                p99 = Summary.of([p for _, p in kept]).median
                cells += [f"{longest.hi:.1f} ({longest.median:.1f})", f"{p99:.2f}"]
                result.figures[f"{backend}.{who}_stall_ms_{state_size}"] = longest.hi
                result.figures[f"{backend}.{who}_stall_median_ms_{state_size}"] = longest.median
            rows.append([backend, name, *cells])
    result.tables.append(
        Table(
            "Longest stall of the loop that executes the runs (ms)",
            [
                "backend",
                "contender",
                "1 KB: longest (median round)",
                "1 KB: p99",
                f"{label}: longest (median round)",
                f"{label}: p99",
            ],
            rows,
            "A stall is the delay of a 1 ms timer on that loop: serialization, hashing and "
            "any other synchronous work done on the loop rather than in a thread show up "
            "here, and so does the CPU being taken by other processes (this machine is shared): "
            "the longest stall of all rounds is given with the median of the rounds' longest, "
            "and the p99 is the median of the rounds' 99th percentiles. The first round of each "
            "mix warms up and is not kept.",
        )
    )
    return result


def _stalls(
    settings: Settings, dbs: Databases, backend: str, size: int
) -> dict[str, list[tuple[float, float]]]:
    """(longest, p99) stall per round, keyed "keel.<state size>" and "raw.<state size>"."""
    loop = Loop()
    raw_url = dbs.new(backend, "stall_raw")
    keel_url = dbs.keel(backend, "stall_keel")
    raw = RawRunner(loop, raw_url)
    k = KeelRunner(dbs, keel_url, max_input_bytes=4 * size + 10_000)
    stalls: dict[str, list[tuple[float, float]]] = {}
    try:
        ticker = Ticker(k.loop)

        def keel_mix(state_size: int, r: int) -> float:
            heavy = {"n": 0, "blob": blob(state_size)}
            # Admitted first (admission is another process's work in a deployment), then run
            # by a worker that stops when the queue is dry: nothing else in this process
            # competes with the worker's loop meanwhile.
            for is_heavy in _mix():
                k.submit("chain5-blob" if is_heavy else "chain5", [heavy if is_heavy else {"n": 0}])
            gc.collect()  # what earlier mixes left for the collector is not this mix's stall
            ticker.start()
            stats = k.drain_here(CONCURRENCY)
            found = ticker.stop()
            if stats.finished != STATE_RUNS + PLAIN_RUNS:
                raise BenchError(f"the stall mix's worker: {stats}")
            return _keep(stalls, f"keel.{state_size}", found, r)

        def raw_mix(state_size: int, r: int) -> float:
            heavy = {"n": 0, "blob": blob(state_size)}
            gc.collect()

            async def go() -> tuple[float, float]:
                t = Ticker(asyncio.get_running_loop())
                t.start()
                await asyncio.gather(
                    *(
                        _raw_one(raw, graphs.chain5_blob, heavy)
                        if is_heavy
                        else _raw_one(raw, graphs.chain5, {"n": 0})
                        for is_heavy in _mix()
                    )
                )
                return t.stop()

            return _keep(stalls, f"raw.{state_size}", loop.run(go()), r)

        interleave(
            {
                "keel small": lambda r: keel_mix(1_000, r),
                "keel large": lambda r: keel_mix(size, r),
                "raw small": lambda r: raw_mix(1_000, r),
                "raw large": lambda r: raw_mix(size, r),
            },
            _rounds(settings),
            warmup=WARMUP,
        )
    finally:
        raw.close()
        k.close()
        loop.close()
        dbs.drop(raw_url)
        dbs.drop(keel_url)
    return stalls


def _mix() -> list[bool]:
    """The order runs are started in: each run carrying the state followed by plain ones."""
    per = PLAIN_RUNS // STATE_RUNS
    return [i % (per + 1) == 0 for i in range(STATE_RUNS * (per + 1))]


def _keep(
    store: dict[str, list[tuple[float, float]]], key: str, value: tuple[float, float], r: int
) -> float:
    if r >= WARMUP:
        store.setdefault(key, []).append(value)
    return value[0]


async def _raw_one(raw: RawRunner, factory: Any, item: Any) -> None:
    import uuid

    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    await raw.graph(factory).ainvoke(item, config, durability="sync")


def idle(settings: Settings, dbs: Databases) -> CaseResult:
    window = 2.0 if settings.quick else 10.0
    settle = 1.0 if settings.quick else 3.0
    result = CaseResult(
        "idle",
        "10. An idle worker",
        "A standing in-process worker (concurrency 1) on a migrated database with no runs. It "
        f"is left {settle:.0f} s to settle after it started, then its own traffic is counted "
        f"exactly over {window:.0f} s (bench/wire.py): on PostgreSQL every round trip on every "
        "connection it holds (the pool's and its LISTEN connection), on SQLite every "
        "statement on its connections.",
    )
    rows = []
    for backend in settings.backends:
        url = dbs.keel(backend, "idle")
        if backend == "sqlite":
            with sqlite_counting(dbs.sqlite_path(url)) as trace:
                k = KeelRunner(dbs, url)
                try:
                    k.start_worker(observe=False)
                    time.sleep(settle)
                    before = trace.snapshot()
                    if not before.connections:
                        raise BenchError("the idle worker's SQLite connection was not counted")
                    time.sleep(window)
                    c = trace.snapshot() - before
                finally:
                    k.close()
            per_s = {"statements": c.statements / window, "commits": c.commits / window}
            rows.append(
                [
                    backend,
                    f"{per_s['statements']:.2f} statements",
                    f"{per_s['commits']:.2f} commits ({c.durable / window:.2f} wrote)",
                    "-",
                ]
            )
            result.figures["sqlite.idle_statements_per_s"] = per_s["statements"]
        else:
            with PgCounter(url) as counter:
                k = KeelRunner(dbs, counter.url(url))
                try:
                    k.start_worker(observe=False)
                    time.sleep(settle)
                    p0 = counter.snapshot()
                    if not p0.connections:
                        raise BenchError("the idle worker's connections were not counted")
                    time.sleep(window)
                    p = counter.snapshot() - p0
                finally:
                    k.close()
            rows.append(
                [
                    backend,
                    f"{p.round_trips / window:.2f} round trips",
                    f"{p.transactions / window:.2f} transactions ({p.writing / window:.2f} wrote)",
                    f"{p.pool_checks / window:.2f}",
                ]
            )
            result.figures["postgres.idle_round_trips_per_s"] = p.round_trips / window
        dbs.drop(url)
    result.tables.append(
        Table(
            "An idle worker's traffic per second",
            ["backend", "requests/s", "commits or transactions/s", "PG pool checks/s"],
            rows,
        )
    )
    return result
