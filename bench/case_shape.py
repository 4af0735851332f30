"""Case 1b: how the cost grows with the graph's length and width.

The 5-node chain, a 20-node chain and a 4-way `Send` fan-out (fan -> 4 parallel leaves ->
join), each run by raw LangGraph (official saver, durability="sync") and by Keel, interleaved
round by round, and their database traffic counted exactly (bench/wire.py) in untimed
batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import graphs
from bench.case_step import count_raw_and_keel
from bench.common import (
    CaseResult,
    Databases,
    Loop,
    Settings,
    Summary,
    Table,
    Traffic,
    interleave,
    ratios,
)
from bench.runners import KeelRunner, RawRunner

# name -> (raw graph, Keel workflow, supersteps, tasks)
SHAPES: dict[str, tuple[Callable[[], Any], str, int, int]] = {
    "5-node chain": (graphs.chain5, "chain5", 5, 5),
    "20-node chain": (graphs.chain20, "chain20", 20, 20),
    f"{graphs.FAN_WIDTH}-way Send fan-out": (
        graphs.fanout4,
        "fanout4",
        3,
        graphs.FAN_WIDTH + 2,
    ),
}
KEYS = {"5-node chain": "chain5", "20-node chain": "chain20"}


def _key(shape: str) -> str:
    return KEYS.get(shape, "fanout4")


def _samples(settings: Settings) -> int:
    return settings.samples if settings.quick else 30


def run(settings: Settings, dbs: Databases) -> CaseResult:
    n = _samples(settings)
    result = CaseResult(
        "shape",
        "1b. Cost by length and width: 20-node chain, 4-way fan-out",
        "The 5-node chain of case 1, a 20-node chain and a fan-out (`fan` returns four "
        "`Send('leaf', ...)`, the four leaves run as one superstep, `join` sums them: 3 "
        'supersteps, 6 tasks). Raw LangGraph (official saver, `durability="sync"`) and Keel '
        "(submit to finished, standing worker), one run of each per round, "
        f"{settings.warmup} warm-up and {n} measured rounds per shape; traffic counted as in "
        "case 1, per run and per superstep.",
    )
    times: list[list[str]] = []
    traffic: dict[str, dict[str, dict[str, Traffic]]] = {}
    for backend in settings.backends:
        loop = Loop()
        raw_url = dbs.new(backend, "shape_raw")
        keel_url = dbs.keel(backend, "shape_keel")
        series = _timed(settings, dbs, loop, raw_url, keel_url, n)
        for shape, (factory, workflow, steps, tasks) in SHAPES.items():
            counts = count_raw_and_keel(settings, dbs, loop, raw_url, keel_url, factory, workflow)
            traffic.setdefault(shape, {})[backend] = counts
            ratio = ratios(series[shape]["keel"], series[shape]["raw"])
            raw_ms = Summary.of([v * 1e3 for v in series[shape]["raw"]])
            keel_ms = Summary.of([v * 1e3 for v in series[shape]["keel"]])
            times.append(
                [
                    backend,
                    shape,
                    f"{steps} / {tasks}",
                    raw_ms.fmt(2),
                    keel_ms.fmt(2),
                    f"{keel_ms.median / steps:.2f}",
                    ratio.fmt(2),
                ]
            )
            key = _key(shape)
            result.figures[f"{backend}.{key}_ratio"] = ratio.median
            for who in ("raw", "keel"):
                for name, value in counts[who].values.items():
                    result.figures[f"{backend}.{key}_{who}_{name}"] = value
            result.data[f"{backend}.{key}"] = {"raw": raw_ms, "keel": keel_ms}
        loop.close()
    result.tables.append(
        Table(
            "Time per run by shape",
            [
                "backend",
                "graph",
                "supersteps / tasks",
                "raw ms/run",
                "Keel ms/run",
                "Keel ms/superstep",
                "Keel/raw",
            ],
            times,
        )
    )
    result.tables.append(_traffic_table(traffic))
    return result


def _timed(
    settings: Settings, dbs: Databases, loop: Loop, raw_url: str, keel_url: str, n: int
) -> dict[str, dict[str, list[float]]]:
    raw = RawRunner(loop, raw_url)
    k = KeelRunner(dbs, keel_url)
    series: dict[str, dict[str, list[float]]] = {}
    try:
        k.start_worker()
        for shape, (factory, workflow, _, _) in SHAPES.items():
            series[shape] = interleave(
                {
                    "raw": lambda r, f=factory: raw.one(f, {"n": 0}),
                    "keel": lambda r, w=workflow: k.one(w, {"n": 0}),
                },
                n,
                settings.warmup,
            )
    finally:
        raw.close()
        k.close()
    return series


def _traffic_table(traffic: dict[str, dict[str, dict[str, Traffic]]]) -> Table:
    rows = []
    for shape, by_backend in traffic.items():
        steps = SHAPES[shape][2]

        def cell(
            backend: str,
            key: str,
            by: dict[str, dict[str, Traffic]] = by_backend,
            steps: int = steps,
        ) -> str:
            if backend not in by:
                return "n/a"
            keel, raw = by[backend]["keel"].get(key), by[backend]["raw"].get(key)
            return f"{keel:.1f} / {raw:.1f} ({keel / steps:.1f} / {raw / steps:.1f})"

        rows.append(
            [
                shape,
                cell("sqlite", "statements"),
                cell("sqlite", "durable"),
                cell("postgres", "round_trips"),
                cell("postgres", "transactions"),
                cell("postgres", "durable"),
            ]
        )
    return Table(
        "Database traffic per run by shape: Keel / raw (per superstep in parentheses)",
        [
            "graph",
            "SQLite statements",
            "SQLite durable commits",
            "PG round trips",
            "PG transactions",
            "PG writing transactions",
        ],
        rows,
        "Per superstep divides the run's whole traffic (admission, claim and completion "
        "included for Keel) by its supersteps, so the fixed per-run cost shows as the "
        "difference between the 5- and 20-node chains.",
    )
