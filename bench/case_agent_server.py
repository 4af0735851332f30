"""Case 14: the Agent Server API, Keel against `langgraph dev`, through the same SDK client.

Per measurement, one server starts on a fresh database (or, for langgraph dev, in a fresh
folder: it keeps its state in memory and pickles it there) with the same 5-node graph from a
langgraph.json project, and `langgraph_sdk`'s async client then:

1. creates N threads (untimed), then N background runs on them (`runs.create`, 10 requests in
   flight) and waits for them all: runs/s = N / the time from the
   first create to the moment all read as ended (each run, in creation order, read with
   `runs.get` every 20 ms until it has);
2. streams M runs one after the other, each on a new thread (`runs.stream`, mode `values`):
   the time from the request to the first event (the `metadata` event both servers send
   first), to the first `values` event, and to the end of the stream; p50 and p95 over the M.

Contenders, measured in turn (A B C, then C B A) for `rounds` measurements each: `langgraph
dev --n-jobs-per-worker 10` (in-memory, not durable), `keel dev --config langgraph.json` on
SQLite (one worker in the process, 10 runs at once), and `keel serve --config` beside one
`keel worker --concurrency 10` on PostgreSQL (two processes, a token sent as `x-api-key`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    CaseResult,
    Databases,
    Loop,
    Settings,
    Summary,
    Table,
    interleave,
    ratios,
)
from bench.servers import (
    GRAPH_ID,
    NODES,
    Server,
    ServerError,
    keel_dev,
    keel_serve_and_worker,
    langgraph_cli,
    langgraph_dev,
)

IN_FLIGHT = 10
POLL = 0.02
BUSY = ("pending", "running")
FIGURES = ("runs_s", "first_p50", "first_p95", "values_p50", "values_p95", "last_p50", "last_p95")


def plan(settings: Settings) -> tuple[int, int, int]:
    """(background runs, streamed runs, measurements per contender)."""
    return (20, 5, 1) if settings.quick else (200, 30, 3)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _measure(server: Server, runs: int, streams: int) -> dict[str, float]:
    from langgraph_sdk import get_client

    client = get_client(url=server.url, api_key=server.api_key)
    start_input: dict[str, Any] = {"n": 0, "steps": []}
    # Warm-up: the graph loaded, the first run and stream paid for, by every contender alike.
    warm = await client.threads.create()
    run = await client.runs.create(warm["thread_id"], GRAPH_ID, input=start_input)
    await client.runs.join(warm["thread_id"], run["run_id"])
    async for _ in client.runs.stream(None, GRAPH_ID, input=start_input):
        pass

    threads = [(await client.threads.create())["thread_id"] for _ in range(runs)]
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def create(thread_id: str) -> str:
        async with gate:
            made = await client.runs.create(thread_id, GRAPH_ID, input=start_input)
            return str(made["run_id"])

    began = time.perf_counter()
    run_ids = await asyncio.gather(*(create(t) for t in threads))
    # Each run in creation order, read until it ended: `runs.join` is not used because
    # langgraph dev answers a join only at its own poll, ~0.5-1 s after the run ended.
    for thread_id, run_id in zip(threads, run_ids, strict=True):
        while (status := (await client.runs.get(thread_id, run_id))["status"]) in BUSY:  # noqa: ASYNC110
            await asyncio.sleep(POLL)
        if status != "success":
            raise ServerError(f"{server.name}: run {run_id} ended {status}")
    elapsed = time.perf_counter() - began

    first: list[float] = []
    values: list[float] = []
    last: list[float] = []
    for _ in range(streams):
        thread_id = (await client.threads.create())["thread_id"]
        seen: list[tuple[str, float]] = []
        final: dict[str, Any] = {}
        t0 = time.perf_counter()
        async for part in client.runs.stream(thread_id, GRAPH_ID, input=start_input):
            seen.append((part.event, time.perf_counter() - t0))
            if part.event == "values" and part.data.get("n") == len(NODES):
                final = part.data
        end = time.perf_counter() - t0
        names = [name for name, _ in seen]
        if names[0] != "metadata" or "values" not in names or final.get("n") != len(NODES):
            raise ServerError(f"{server.name}: unexpected stream {names}")
        first.append(seen[0][1])
        values.append(next(t for name, t in seen if name == "values"))
        last.append(end)
    return {
        "runs_s": runs / elapsed,
        **{f"first_p{q}": _pct(first, q / 100) * 1e3 for q in (50, 95)},
        **{f"values_p{q}": _pct(values, q / 100) * 1e3 for q in (50, 95)},
        **{f"last_p{q}": _pct(last, q / 100) * 1e3 for q in (50, 95)},
    }


def run(settings: Settings, dbs: Databases) -> CaseResult:
    runs, streams, rounds = plan(settings)
    result = CaseResult(
        "agent-server",
        "14. Agent Server API: Keel against langgraph dev",
        f"The same 5-node graph (each node adds one to a counter) from one langgraph.json "
        "project, served by each contender in turn (A B C, then C B A), each measurement on "
        "a fresh server with a fresh database (langgraph dev: a fresh folder, where it "
        "pickles its in-memory state), through `langgraph_sdk`'s async client. After a "
        f"warm-up run and stream, {runs} threads are created (untimed), then {runs} "
        f"background runs on them (`runs.create`, {IN_FLIGHT} requests in flight); runs/s "
        f"is {runs} / the time from the first create until all read as ended (each run, "
        "in creation order, read with `runs.get` every 20 ms until it has; `runs.join` is "
        "not used because langgraph dev answers a join only at its next poll, 0.5-1 s after "
        f"the run ended). Then {streams} runs are streamed one after another, each on a new "
        "thread (`runs.stream`, mode `values`): time from the request to the first event "
        "(the `metadata` event both send first), to the first `values` event, and to the "
        f"end of the stream; p50 and p95 over the {streams}. Contenders: `langgraph dev "
        "--n-jobs-per-worker 10` (langgraph-api's in-memory runtime: not durable), `keel "
        "dev --config langgraph.json` on SQLite (API and one worker in one process, 10 runs "
        "at once; durable), and `keel serve --config` beside one `keel worker --concurrency "
        "10` on PostgreSQL (two processes; a token sent as `x-api-key`). Figures are medians "
        f"(min-max) of {rounds} measurement(s) per contender.",
    )
    cli = langgraph_cli()
    contenders: dict[str, Callable[[int], Server]] = {}
    counter = iter(range(10_000))

    def folder(label: str) -> Path:
        return dbs.tmp / f"{label}-{next(counter)}"

    if cli is None:
        result.notes.append(
            "langgraph dev was not measured: no `langgraph` CLI (set $KEEL_LANGGRAPH_DEV to "
            'one installed with `pip install "langgraph-cli[inmem]"`).'
        )
    else:
        contenders["langgraph dev (in memory)"] = lambda r: langgraph_dev(cli, folder("lgdev"))
    if "sqlite" in settings.backends:
        contenders["keel dev (SQLite)"] = lambda r: keel_dev(
            folder("keeldev"), dbs.new("sqlite", f"as_dev_{r}")
        )
    if "postgres" in settings.backends:
        contenders["keel serve + worker (PostgreSQL)"] = lambda r: keel_serve_and_worker(
            folder("keelserve"), dbs.new("postgres", f"as_serve_{r}")
        )

    found: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    loop = Loop()

    def measure(name: str) -> Callable[[int], float]:
        def once(r: int) -> float:
            server = contenders[name](r)
            try:
                server.wait_ready()
                found[name].append(loop.run(_measure(server, runs, streams)))
            finally:
                server.stop()
            return found[name][-1]["runs_s"]

        return once

    try:
        interleave({name: measure(name) for name in contenders}, rounds, warmup=0)
    finally:
        loop.close()

    med = {name: {k: Summary.of([m[k] for m in ms]) for k in FIGURES} for name, ms in found.items()}
    rows = []
    for name, s in med.items():
        rows.append(
            [
                name,
                s["runs_s"].fmt(1),
                f"{s['first_p50'].fmt(1)} / {s['first_p95'].fmt(1)}",
                f"{s['values_p50'].fmt(1)} / {s['values_p95'].fmt(1)}",
                f"{s['last_p50'].fmt(1)} / {s['last_p95'].fmt(1)}",
            ]
        )
        key = name.split(" (")[0].replace(" + ", "_").replace(" ", "_")
        store = "sqlite" if "SQLite" in name else "postgres" if "Postgre" in name else "memory"
        for figure in FIGURES:
            result.figures[f"{store}.as_{key}_{figure}"] = s[figure].median
    result.data["agent_server"] = found
    result.tables.append(
        Table(
            f"Agent Server: {runs} background runs, {streams} streamed runs",
            [
                "server",
                "runs/s",
                "to first event, p50 / p95 (ms)",
                "to first values, p50 / p95 (ms)",
                "to last event, p50 / p95 (ms)",
            ],
            rows,
            f"Medians (min-max) of {rounds} measurement(s) per server, each on a fresh "
            "database and a fresh server, in turn. runs/s: background runs created 10 at a "
            "time, then read until ended; stream times from the `runs.stream` request.",
        )
    )
    result.tables.append(targets(found))
    return result


def targets(found: dict[str, list[dict[str, float]]]) -> Table:
    """Issue 32's: Keel dev's runs/s ≥ langgraph dev's (SQLite, durable); first-event p50 ≤
    1.2x langgraph dev's. Judged on the median of per-round ratios (round i of one server ran
    beside round i of the other), which other work on the machine moves less than either."""
    base = next((ms for name, ms in found.items() if name.startswith("langgraph dev")), None)
    rows = []
    for name, ms in found.items():
        if name.startswith("langgraph dev") or base is None:
            continue
        speed = ratios([m["runs_s"] for m in ms], [m["runs_s"] for m in base])
        first = ratios([m["first_p50"] for m in ms], [m["first_p50"] for m in base])
        rows.append(
            [
                name,
                speed.fmt(2),
                "met" if round(speed.median, 2) >= 1.0 else "**not met**",
                first.fmt(2),
                "met" if round(first.median, 2) <= 1.2 else "**not met**",
            ]
        )
    return Table(
        "Targets (issue 32)",
        [
            "server",
            "runs/s / langgraph dev's (≥ 1.0)",
            "",
            "first-event p50 / langgraph dev's (≤ 1.2)",
            "",
        ],
        rows,
        "Median (min-max) of the per-round ratios. The runs/s target is the issue's for keel "
        "dev on SQLite; PostgreSQL's row is shown against the same bound.",
    )
