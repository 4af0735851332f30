"""`python -m bench`: run the cases, write the report.

python -m bench                       # every case, both backends -> docs/benchmarks.md
python -m bench --quick               # smoke run -> bench/results/benchmarks-quick.md
python -m bench --cases step,floor --backends sqlite --out /tmp/b.md --no-plots
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench.common import BACKENDS, REPO, CaseResult, Databases, Settings, pg_admin

CASES = (
    "floor", "step", "shape", "fanout", "effect", "approval", "drain", "drain-ratio", "takeover",
    "state", "stall", "memory", "console", "prune", "idle", "retention", "thread", "schedules",
    "agent-server", "accumulate",
)  # fmt: skip


def _runner(case: str) -> Callable[[Settings, Databases, dict[str, float]], CaseResult]:
    from bench import (
        case_accumulate,
        case_agent_server,
        case_approval,
        case_console,
        case_drain,
        case_drain_ratio,
        case_fanout,
        case_floor,
        case_loop,
        case_memory,
        case_prune,
        case_retention,
        case_schedules,
        case_shape,
        case_state,
        case_step,
        case_takeover,
        case_thread,
    )

    table: dict[str, Callable[[Settings, Databases, dict[str, float]], CaseResult]] = {
        "floor": lambda s, d, f: case_floor.run(s, d),
        "step": case_step.per_step,
        "shape": lambda s, d, f: case_shape.run(s, d),
        "fanout": lambda s, d, f: case_fanout.run(s, d),
        "effect": case_step.per_effect,
        "approval": case_approval.run,
        "drain": case_drain.run,
        "drain-ratio": lambda s, d, f: case_drain_ratio.run(s, d),
        "takeover": lambda s, d, f: case_takeover.run(s, d),
        "state": lambda s, d, f: case_state.run(s, d),
        "stall": lambda s, d, f: case_loop.stall(s, d),
        "idle": lambda s, d, f: case_loop.idle(s, d),
        "memory": lambda s, d, f: case_memory.run(s, d),
        "prune": lambda s, d, f: case_prune.run(s, d),
        "retention": lambda s, d, f: case_retention.run(s, d),
        "console": lambda s, d, f: case_console.run(s, d),
        "thread": lambda s, d, f: case_thread.run(s, d),
        "schedules": lambda s, d, f: case_schedules.run(s, d),
        "agent-server": lambda s, d, f: case_agent_server.run(s, d),
        "accumulate": lambda s, d, f: case_accumulate.run(s, d),
    }
    return table[case]


def _postgres_problem() -> str | None:
    try:
        with pg_admin() as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny batches: a smoke run")
    parser.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="sqlite,postgres")
    parser.add_argument("--out", type=Path, help="report path (default docs/benchmarks.md)")
    parser.add_argument("--plots-dir", type=Path, help="default: <report folder>/benchmarks/")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--tmp", help="folder for SQLite files (default: .keel/ in the repo)")
    args = parser.parse_args(argv)

    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if set(backends) - set(BACKENDS) or not backends:
        parser.error("--backends takes sqlite and/or postgres")
    notes: list[str] = []
    if "postgres" in backends and (problem := _postgres_problem()):
        notes.append(f"PostgreSQL was not measured: {problem}")
        print(f"bench: PostgreSQL unreachable, SQLite only: {problem}", file=sys.stderr)
        backends.remove("postgres")
    if not backends:
        return 2
    settings = Settings.make(args.quick, backends)
    default_out = (
        REPO / "bench" / "results" / "benchmarks-quick.md"
        if args.quick
        else REPO / "docs" / "benchmarks.md"
    )
    out: Path = args.out or default_out
    plots_dir = None if args.no_plots else (args.plots_dir or out.parent / "benchmarks")

    start = time.perf_counter()
    loads = [os.getloadavg()[0]]
    results: dict[str, CaseResult] = {}
    errors: dict[str, str] = {}
    floors: dict[str, float] = {}
    dbs = Databases(args.tmp)
    try:
        for case in [c for c in CASES if c in cases]:
            t = time.perf_counter()
            print(f"bench: {case} ...", file=sys.stderr, flush=True)
            try:
                results[case] = _runner(case)(settings, dbs, floors)
            except Exception as exc:
                traceback.print_exc()
                errors[case] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
                print(f"bench: {case} FAILED: {errors[case]}", file=sys.stderr, flush=True)
                continue
            if case == "floor":
                floors.update(
                    {b: results[case].figures[f"{b}.floor_ms"] for b in settings.backends}
                )
            print(f"bench: {case} done in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    finally:
        dbs.close()
    from bench import report

    loads.append(os.getloadavg()[0])
    report.write(
        results, errors, settings, out, plots_dir, time.perf_counter() - start, notes, loads
    )
    print(f"bench: wrote {out} in {(time.perf_counter() - start) / 60:.1f} min", file=sys.stderr)
    return 1 if errors else 0


def quiet_logs() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A lost lease or a killed worker is what some cases do on purpose; keep their logs quiet.
    logging.getLogger("keel").setLevel(logging.ERROR)


if __name__ == "__main__":
    quiet_logs()
    raise SystemExit(main())
