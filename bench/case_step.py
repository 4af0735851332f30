"""Cases 1 and 2: what a step costs, and what an effect adds to it.

Case 1 runs the same 5-node chain three ways (no checkpointer; raw LangGraph with the official
saver and durability="sync"; a Keel run), interleaved round by round. Case 2 runs the chain on
Keel twice: each node calling one `@keel.effect`, and each node calling the same function
without the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench import graphs
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
from bench.runners import KeelRunner, PlainRunner, RawRunner, traffic_per_run

STEPS = len(graphs.NODES)


def per_step(settings: Settings, dbs: Databases, floors: dict[str, float]) -> CaseResult:
    result = CaseResult(
        "step",
        "1. Per step: a 5-node chain",
        "One run of a 5-node chain (nodes are plain `def` that add 1) per contender per round, "
        "contenders in turn: no checkpointer (`ainvoke`), raw LangGraph (official async saver, "
        '`durability="sync"`, `ainvoke`, a new thread per run), and Keel (`app.submit`, then a '
        "standing in-process worker at concurrency 1 executes it; time from just before "
        "`submit` to the run's `finished_at`, so admission, claim and completion are in). "
        f"{settings.warmup} warm-up rounds, then {settings.samples} measured rounds: medians "
        "with min-max over runs. ms/step = ms/run / 5; overhead/step subtracts the "
        "no-checkpointer run of the same round. Commits per run are counted in separate, "
        "untimed batches (see Method).",
    )
    rows = []
    item = {"n": 0}
    for backend in settings.backends:
        loop = Loop()
        raw_url = dbs.new(backend, "step_raw")
        keel_url = dbs.keel(backend, "step_keel")
        plain = PlainRunner(loop)
        raw = RawRunner(loop, raw_url)
        k = KeelRunner(dbs, keel_url)
        try:
            k.start_worker()
            series = interleave(
                {
                    "none": lambda r, plain=plain: plain.one(graphs.chain5, item),
                    "raw": lambda r, raw=raw: raw.one(graphs.chain5, item),
                    "keel": lambda r, k=k: k.one("chain5", item),
                },
                settings.samples,
                settings.warmup,
            )
        finally:
            raw.close()
            k.close()

        counts: dict[str, Traffic] = {
            "none": Traffic.zero(backend),
            **count_raw_and_keel(settings, dbs, loop, raw_url, keel_url, graphs.chain5, "chain5"),
        }
        loop.close()

        ms = {name: Summary.of([v * 1e3 for v in values]) for name, values in series.items()}
        base = series["none"]
        ratio = ratios(series["keel"], series["raw"])
        floor = floors.get(backend)
        for name, label in (
            ("none", "no checkpointer"),
            ("raw", "raw LangGraph"),
            ("keel", "Keel"),
        ):
            overhead = Summary.of(
                [(v - b) * 1e3 / STEPS for v, b in zip(series[name], base, strict=False)]
            )
            rows.append(
                [
                    backend,
                    label,
                    ms[name].fmt(2),
                    ms[name].scaled(1 / STEPS).fmt(2),
                    "-" if name == "none" else overhead.fmt(2),
                    f"{1 / ms[name].median * 1e3:,.1f}",
                    counts[name].fmt_commits(),
                    "-" if not floor else f"{ms[name].median / floor:.1f}",
                    ratio.fmt(2) if name == "keel" else "",
                ]
            )
            result.data[f"{backend}.{name}"] = ms[name]
        result.figures[f"{backend}.keel_raw_ratio"] = ratio.median
        result.figures[f"{backend}.raw_overhead_ms_step"] = Summary.of(
            [(v - b) * 1e3 / STEPS for v, b in zip(series["raw"], base, strict=False)]
        ).median
        result.figures[f"{backend}.keel_commits"] = counts["keel"].durable
        result.figures[f"{backend}.raw_commits"] = counts["raw"].durable
        for who in ("raw", "keel"):
            for key, value in counts[who].values.items():
                result.figures[f"{backend}.{who}_{key}"] = value
        result.data[f"{backend}.traffic"] = counts
    result.tables.append(
        Table(
            "5-node chain, per run",
            [
                "backend",
                "contender",
                "ms/run",
                "ms/step",
                "overhead ms/step",
                "runs/s",
                "commits/run",
                "ms/run in commit floors",
                "Keel/raw",
            ],
            rows,
            "Keel/raw is the median (min-max) of the per-round ratios of single runs. "
            "Commits: SQLite counts COMMIT statements and autocommitted writes (and those that "
            "wrote, the ones that cost an fsync); PostgreSQL counts the client's transactions on "
            "the wire (and those that wrote, the ones that cost a WAL flush).",
        )
    )
    result.tables.append(traffic_table(result, "5-node chain: database traffic per run"))
    return result


def count_raw_and_keel(
    settings: Settings,
    dbs: Databases,
    loop: Loop,
    raw_url: str,
    keel_url: str,
    factory: Callable[[], Any],
    workflow: str,
) -> dict[str, Traffic]:
    """Traffic per run of raw LangGraph and of Keel on the same graph, in untimed batches."""
    small, large = 2, 2 + settings.count_runs

    def raw_count(m: int, url: str) -> None:
        runner = RawRunner(loop, url)
        try:
            runner.batch(factory, [{"n": 0}] * m)
        finally:
            runner.close()

    def keel_count(m: int, url: str) -> None:
        runner = KeelRunner(dbs, url)
        try:
            runner.batch(workflow, [{"n": 0}] * m)
        finally:
            runner.close()

    return {
        "raw": traffic_per_run(raw_url, raw_count, small, large),
        "keel": traffic_per_run(keel_url, keel_count, small, large),
    }


TRAFFIC_COLUMNS = [
    "contender",
    "SQLite statements",
    "SQLite durable commits",
    "PG round trips (pool checks)",
    "PG transactions (wrote)",
]


def traffic_row(label: str, by_backend: dict[str, Traffic], per: float = 1.0) -> list[str]:
    """One row of the issue's table: a contender's traffic on both backends, divided by `per`."""
    lite, pg = by_backend.get("sqlite"), by_backend.get("postgres")

    def n(t: Traffic | None, key: str) -> str:
        return "n/a" if t is None else f"{t.get(key) / per:.1f}"

    return [
        label,
        n(lite, "statements"),
        n(lite, "durable"),
        "n/a" if pg is None else f"{n(pg, 'round_trips')} ({n(pg, 'pool_checks')})",
        "n/a" if pg is None else f"{n(pg, 'transactions')} ({n(pg, 'durable')})",
    ]


def traffic_table(result: CaseResult, title: str) -> Table:
    by: dict[str, dict[str, Traffic]] = {"keel": {}, "raw": {}}
    for key, counts in result.data.items():
        if key.endswith(".traffic"):
            for who in by:
                by[who][key.split(".")[0]] = counts[who]
    return Table(
        title,
        TRAFFIC_COLUMNS,
        [
            traffic_row("Keel", by["keel"]),
            traffic_row('raw LangGraph, official saver, durability="sync"', by["raw"]),
        ],
        "Counted exactly on the measured client's own connections (bench/wire.py), per run "
        "from submit to completed (Keel) or `ainvoke` (raw), in untimed batches: SQLite "
        "statements from the trace callback (BEGIN and COMMIT included), durable commits "
        "those that wrote; PostgreSQL round trips through a counting proxy (each time the "
        "client sent after the server had answered; pool checks are psycopg_pool's empty "
        "queries at checkout) and transactions (wrote: committed after a statement that "
        "modified or locked rows).",
    )


def per_effect(settings: Settings, dbs: Databases, floors: dict[str, float]) -> CaseResult:
    effects = STEPS  # every node of the chain calls one effect
    result = CaseResult(
        "effect",
        "2. Per effect",
        "Keel only. The 5-node chain where every node calls one `@keel.effect` (a function "
        "that returns at once), against the same chain where every node calls the same "
        "function directly; one run of each per round, through the same standing worker, "
        f"{settings.warmup} warm-up and {settings.samples} measured rounds. Extra cost per "
        "effect = (with - without) / 5, per round.",
    )
    rows = []
    item = {"n": 0}
    for backend in settings.backends:
        url = dbs.keel(backend, "effect")
        k = KeelRunner(dbs, url)
        try:
            k.start_worker()
            series = interleave(
                {
                    "without": lambda r, k=k: k.one("chain5-no-effect", item),
                    "with": lambda r, k=k: k.one("chain5-effect", item),
                },
                settings.samples,
                settings.warmup,
            )
        finally:
            k.close()
        small, large = 2, 2 + settings.count_runs
        counted: dict[str, Traffic] = {}
        for workflow in ("chain5-no-effect", "chain5-effect"):

            def count(m: int, url: str, wf: str = workflow) -> None:
                runner = KeelRunner(dbs, url)
                try:
                    runner.batch(wf, [{"n": 0}] * m)
                finally:
                    runner.close()

            counted[workflow] = traffic_per_run(url, count, small, large)
        extra = Summary.of(
            [
                (w - o) * 1e3 / effects
                for w, o in zip(series["with"], series["without"], strict=False)
            ]
        )
        extra_commits = (counted["chain5-effect"] - counted["chain5-no-effect"]).scaled(1 / effects)
        floor = floors.get(backend)
        in_floors = extra.median / floor if floor else float("nan")
        rows.append(
            [
                backend,
                Summary.of([v * 1e3 for v in series["without"]]).fmt(2),
                Summary.of([v * 1e3 for v in series["with"]]).fmt(2),
                extra.fmt(2),
                extra_commits.fmt_commits(),
                "-" if backend == "sqlite" else f"{extra_commits.get('round_trips'):.1f}",
                f"{in_floors:.1f}" if floor else "-",
            ]
        )
        result.figures[f"{backend}.effect_extra_ms"] = extra.median
        result.figures[f"{backend}.effect_extra_commits"] = extra_commits.durable
        result.figures[f"{backend}.effect_extra_round_trips"] = extra_commits.get("round_trips")
        result.figures[f"{backend}.effect_extra_floors"] = in_floors
    result.tables.append(
        Table(
            "One effect per node, 5 per run",
            [
                "backend",
                "ms/run without",
                "ms/run with",
                "extra ms/effect",
                "extra commits/effect",
                "extra PG round trips/effect",
                "extra in commit floors",
            ],
            rows,
            "Commits and round trips counted as in case 1 (bench/wire.py): the difference "
            "between the chain with and without effects, per effect.",
        )
    )
    return result
