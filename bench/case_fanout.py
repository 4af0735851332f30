"""Case 1c: cost against fan-out width, `Send` to 1, 10 and 100 tasks.

The graph of case 1b's fan-out with a variable width: `fan` returns W `Send('leaf', ...)`, the
W leaves run as one superstep, `join` sums them (3 supersteps, W + 2 tasks). Raw LangGraph
(official saver, durability="sync") and Keel (submit to finished, standing worker) take turns
run by run; traffic per run is counted exactly (bench/wire.py) in untimed batches, as in case
1b.
"""

from __future__ import annotations

import dataclasses

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

WIDE = 100  # from this width on, fewer rounds: a run writes W task results


def _rounds(settings: Settings, width: int) -> tuple[int, int]:
    """(measured, warm-up) rounds for one width."""
    if settings.quick:
        return (2, 1) if width >= WIDE else (settings.samples, settings.warmup)
    return (8, 1) if width >= WIDE else (20, settings.warmup)


def run(settings: Settings, dbs: Databases) -> CaseResult:
    widths = graphs.FAN_WIDTHS
    full = {w: _rounds(settings, w) for w in widths}
    result = CaseResult(
        "fanout",
        "1c. Cost by fan-out width: `Send` to 1, 10, 100 tasks",
        "`fan` returns W `Send('leaf', ...)`, the W leaves run as one superstep, `join` sums "
        "them (3 supersteps, W + 2 tasks). Raw LangGraph (official saver, "
        '`durability="sync"`) and Keel (submit to finished, standing worker at concurrency 1), '
        "one run of each per round; "
        + "; ".join(
            f"W={w}: {u} warm-up and {m} measured round{'s' if m > 1 else ''}"
            for w, (m, u) in full.items()
        )
        + ". Traffic counted as in case 1 (untimed batches; "
        f"{settings.count_runs} extra runs, {max(2, settings.count_runs // 3)} for W={WIDE}). "
        "ms/task divides the run's time by its W + 2 tasks.",
    )
    times: list[list[str]] = []
    counted: dict[int, dict[str, dict[str, Traffic]]] = {}
    for backend in settings.backends:
        loop = Loop()
        raw_url = dbs.new(backend, "fanout_raw")
        keel_url = dbs.keel(backend, "fanout_keel")
        series = _timed(settings, dbs, loop, raw_url, keel_url)
        for width in widths:
            # Counting batches at W=100 cost as much as the timed rounds: fewer runs there.
            count_settings = (
                dataclasses.replace(settings, count_runs=max(2, settings.count_runs // 3))
                if width >= WIDE
                else settings
            )
            counts = count_raw_and_keel(
                count_settings,
                dbs,
                loop,
                raw_url,
                keel_url,
                graphs.FANOUTS[width],
                f"fanout-{width}",
            )
            counted.setdefault(width, {})[backend] = counts
            raw_ms = Summary.of([v * 1e3 for v in series[width]["raw"]])
            keel_ms = Summary.of([v * 1e3 for v in series[width]["keel"]])
            ratio = ratios(series[width]["keel"], series[width]["raw"])
            tasks = width + 2
            times.append(
                [
                    backend,
                    str(width),
                    raw_ms.fmt(2),
                    keel_ms.fmt(2),
                    f"{raw_ms.median / tasks:.2f}",
                    f"{keel_ms.median / tasks:.2f}",
                    ratio.fmt(2),
                ]
            )
            result.data[f"{backend}.{width}"] = {"raw": raw_ms, "keel": keel_ms}
            result.figures[f"{backend}.fanout{width}_ratio"] = ratio.median
            for who in ("raw", "keel"):
                for name, value in counts[who].values.items():
                    result.figures[f"{backend}.fanout{width}_{who}_{name}"] = value
        loop.close()
        dbs.drop(raw_url)
        dbs.drop(keel_url)
    result.tables.append(
        Table(
            "Time per run by fan-out width",
            [
                "backend",
                "width W",
                "raw ms/run",
                "Keel ms/run",
                "raw ms/task",
                "Keel ms/task",
                "Keel/raw",
            ],
            times,
        )
    )
    result.tables.append(_traffic_table(counted))
    return result


def _timed(
    settings: Settings, dbs: Databases, loop: Loop, raw_url: str, keel_url: str
) -> dict[int, dict[str, list[float]]]:
    raw = RawRunner(loop, raw_url)
    k = KeelRunner(dbs, keel_url)
    series: dict[int, dict[str, list[float]]] = {}
    try:
        k.start_worker()
        for width in graphs.FAN_WIDTHS:
            measured, warmup = _rounds(settings, width)
            factory, workflow = graphs.FANOUTS[width], f"fanout-{width}"
            series[width] = interleave(
                {
                    "raw": lambda r, f=factory: raw.one(f, {"n": 0}),
                    "keel": lambda r, w=workflow: k.one(w, {"n": 0}),
                },
                measured,
                warmup,
            )
    finally:
        raw.close()
        k.close()
    return series


def _traffic_table(counted: dict[int, dict[str, dict[str, Traffic]]]) -> Table:
    rows = []
    for width, by_backend in counted.items():

        def cell(backend: str, key: str, by: dict[str, dict[str, Traffic]] = by_backend) -> str:
            if backend not in by:
                return "n/a"
            return f"{by[backend]['keel'].get(key):.1f} / {by[backend]['raw'].get(key):.1f}"

        rows.append(
            [
                str(width),
                cell("sqlite", "statements"),
                cell("sqlite", "durable"),
                cell("postgres", "round_trips"),
                cell("postgres", "transactions"),
                cell("postgres", "durable"),
            ]
        )
    return Table(
        "Database traffic per run by fan-out width: Keel / raw",
        [
            "width W",
            "SQLite statements",
            "SQLite durable commits",
            "PG round trips",
            "PG transactions",
            "PG writing transactions",
        ],
        rows,
    )
