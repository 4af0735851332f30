"""Case 3: one approval cycle, Keel against raw LangGraph's interrupt/resume.

Graph: prepare -> review -> finish. Raw: `ainvoke(input)` stops at `interrupt()`, then
`ainvoke(Command(resume={"decision": "approved"}))` runs to the end. Keel: `app.submit`, a
worker runs the run to its wait (`keel.approval`), `app.approve`, a worker resumes it to the end.
"""

from __future__ import annotations

from bench import graphs
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
from bench.runners import KeelRunner, RawRunner, traffic_per_run


def run(settings: Settings, dbs: Databases, floors: dict[str, float]) -> CaseResult:
    result = CaseResult(
        "approval",
        "3. Approval cycle",
        "A 3-node graph (prepare -> review -> finish) whose review pauses for a decision. "
        "Raw LangGraph: `ainvoke` to the `interrupt()`, `aget_state`, then "
        "`ainvoke(Command(resume=...))` to the end. Keel: `app.submit`, a standing in-process "
        "worker runs it to its `keel.approval` wait, `app.approve` (first decision wins, "
        "recorded durably), the worker resumes it to the end; the cycle is (submit -> run "
        "waiting) + (approve -> run completed) from the run's own timestamps, so the time the "
        "bench takes to notice the wait is not counted. One cycle per contender per round, "
        f"{settings.warmup} warm-up and {settings.samples} measured rounds.",
    )
    rows = []
    for backend in settings.backends:
        loop = Loop()
        raw_url = dbs.new(backend, "approval_raw")
        keel_url = dbs.keel(backend, "approval_keel")
        raw = RawRunner(loop, raw_url)
        k = KeelRunner(dbs, keel_url)
        try:
            k.start_worker()
            series = interleave(
                {
                    "raw": lambda r, raw=raw: raw.approval_batch(graphs.approval_raw, [{"n": 0}]),
                    "keel": lambda r, k=k: k.one_approval(),
                },
                settings.samples,
                settings.warmup,
            )
        finally:
            raw.close()
            k.close()
        small, large = 2, 2 + settings.count_runs

        def raw_count(m: int, url: str, loop: Loop = loop) -> None:
            runner = RawRunner(loop, url)
            try:
                runner.approval_batch(graphs.approval_raw, [{"n": 0}] * m)
            finally:
                runner.close()

        def keel_count(m: int, url: str) -> None:
            runner = KeelRunner(dbs, url)
            try:
                runner.approval_batch([{"n": 0}] * m)
            finally:
                runner.close()

        counts = {
            "raw": traffic_per_run(raw_url, raw_count, small, large),
            "keel": traffic_per_run(keel_url, keel_count, small, large),
        }
        loop.close()
        ratio = ratios(series["keel"], series["raw"])
        floor = floors.get(backend)
        for name, label in (("raw", "raw interrupt/resume"), ("keel", "Keel approval")):
            ms = Summary.of([v * 1e3 for v in series[name]])
            rows.append(
                [
                    backend,
                    label,
                    ms.fmt(2),
                    counts[name].fmt_commits(),
                    f"{counts[name].get('statements'):.1f}"
                    if backend == "sqlite"
                    else f"{counts[name].get('round_trips'):.1f}",
                    f"{ms.median / floor:.1f}" if floor else "-",
                    ratio.fmt(2) if name == "keel" else "",
                ]
            )
            result.data[f"{backend}.{name}"] = ms
        result.figures[f"{backend}.approval_ratio"] = ratio.median
    result.tables.append(
        Table(
            "One approval cycle",
            [
                "backend",
                "contender",
                "ms/cycle",
                "commits/cycle",
                "SQLite statements / PG round trips",
                "in commit floors",
                "Keel/raw",
            ],
            rows,
        )
    )
    return result
