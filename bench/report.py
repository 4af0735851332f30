"""docs/benchmarks.md and its plots, from the results of one run."""

from __future__ import annotations

import math
import os
import platform
import sqlite3
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from bench import graphs
from bench.common import CaseResult, Settings, Summary, Table, pg_admin

TARGETS_NOTE = (
    "Targets are the issue's; they are reported, not tuned for. Where this machine's disk makes "
    "a durable commit far slower than the issue's reference machine, compare in commits (case 8)."
)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_facts(settings: Settings, loads: list[float]) -> list[tuple[str, str]]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    facts = [
        ("CPU", f"{cpu}, {os.cpu_count()} cores"),
        ("memory", mem),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", platform.python_version()),
        (
            "load average (1 min) at start, end",
            ", ".join(f"{x:.1f}" for x in loads)
            + f" on {os.cpu_count()} cores"
            + (" (other work shared the machine)" if max(loads, default=0) > 1.5 else ""),
        ),
        ("SQLite library", sqlite3.sqlite_version),
    ]
    try:
        fs = (
            subprocess.run(
                ["df", "-T", str(Path.cwd())], capture_output=True, text=True, timeout=10
            )
            .stdout.splitlines()[-1]
            .split()
        )
        facts.append(("filesystem (SQLite files, PostgreSQL data)", f"{fs[1]} on {fs[0]}"))
    except (OSError, IndexError, subprocess.TimeoutExpired):
        pass
    if "postgres" in settings.backends:
        try:
            with pg_admin() as conn:
                row = conn.execute(
                    "SELECT current_setting('server_version'), "
                    "current_setting('synchronous_commit'), current_setting('fsync'), "
                    "current_setting('wal_sync_method'), current_setting('shared_buffers')"
                ).fetchone()
            if row:
                facts.append(
                    (
                        "PostgreSQL",
                        f"{row[0]} (synchronous_commit={row[1]}, fsync={row[2]}, "
                        f"wal_sync_method={row[3]}, shared_buffers={row[4]}), on 127.0.0.1",
                    )
                )
        except Exception as exc:  # the facts table must not fail the report
            facts.append(("PostgreSQL", f"unavailable: {exc}"))
    for dist in (
        "keel",
        "langgraph",
        "langgraph-checkpoint",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres",
        "aiosqlite",
        "psycopg",
        "dbos",
        "SQLAlchemy",
    ):
        facts.append((dist, _version(dist)))
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            # The report and its plots being rewritten by this very run is not a change.
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                ":(exclude)docs/benchmarks.md",
                ":(exclude)docs/benchmarks",
                ":(exclude)bench/results",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if rev:
            facts.append(("Keel commit", rev + (" (with uncommitted changes)" if dirty else "")))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return facts


def _table(table: Table) -> list[str]:
    out = [f"**{table.title}**", ""]
    out.append("| " + " | ".join(table.columns) + " |")
    out.append("|" + "|".join(" --- " for _ in table.columns) + "|")
    for row in table.rows:
        out.append("| " + " | ".join(row) + " |")
    if table.note:
        out += ["", table.note]
    return [*out, ""]


def _fig(value: float | None, digits: int = 2, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}{unit}"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**not met**")


Check = Callable[[float], bool]


def targets(results: dict[str, CaseResult], settings: Settings) -> list[Table]:
    """Issue 12's targets, then issue 6's that still apply."""

    def fig(case: str, key: str) -> float | None:
        res = results.get(case)
        value = res.figures.get(key) if res else None
        return None if value is None or math.isnan(value) else value

    def row(
        label: str,
        case: str,
        key: str,
        ok: Check | dict[str, Check],
        digits: int = 2,
        unit: str = "",
    ) -> list[str]:
        """`ok` judges both backends, or (a dict) only the backends the target names."""
        checks = ok if isinstance(ok, dict) else {"sqlite": ok, "postgres": ok}
        values = {b: fig(case, f"{b}.{key}") for b in ("sqlite", "postgres")}
        # Judge the figure as shown, so a displayed 2.0 is not "not met" because of 2.004.
        status = [
            f"{name}: {_met(checks[b](round(v, digits)))}"
            for b, name in (("sqlite", "SQLite"), ("postgres", "PostgreSQL"))
            if (v := values[b]) is not None and b in checks
        ]
        return [
            label,
            _fig(values["sqlite"], digits, unit),
            _fig(values["postgres"], digits, unit),
            "; ".join(status) or "n/a",
        ]

    def at_most(limit: float) -> Check:
        return lambda v: v <= limit

    per_run = {"sqlite": at_most(0.8), "postgres": at_most(1.0)}
    issue12 = [
        row("Keel/raw LangGraph per 5-step run ≤ 0.8 (SQLite), ≤ 1.0 (PostgreSQL)",
            "step", "keel_raw_ratio", per_run),
        row("Keel/raw, 20-node chain (same bound)", "shape", "chain20_ratio", per_run),
        row(f"Keel/raw, {graphs.FAN_WIDTH}-way Send fan-out (same bound)",
            "shape", "fanout4_ratio", per_run),
        row("An effect adds ≤ 1 durable commit beyond its record (≤ 2 in all)",
            "effect", "effect_extra_commits", at_most(2.0), 1),
        row("An effect adds ≤ 2 PostgreSQL round trips in all",
            "effect", "effect_extra_round_trips", {"postgres": at_most(2.0)}, 1),
        row("Keel approval cycle ≤ 1.5x raw interrupt/resume",
            "approval", "approval_ratio", at_most(1.5)),
        row("2 Keel workers drain ≥ 2x 1 DBOS worker (target: PostgreSQL)",
            "drain", "keel2_vs_dbos1", {"postgres": lambda v: v >= 2.0}),
        row("An idle worker makes ≤ 1 round trip/s (PostgreSQL; SQLite: statements/s)",
            "idle", "idle_round_trips_per_s", {"postgres": at_most(1.0)}),
    ]  # fmt: skip
    idle_sqlite = fig("idle", "sqlite.idle_statements_per_s")
    if idle_sqlite is not None:
        issue12[-1][1] = _fig(idle_sqlite, 2)
    stall_size = max(settings.state_sizes)
    stall_label = (
        f"{stall_size / 1e6:g} MB" if stall_size >= 1_000_000 else f"{stall_size // 1000} KB"
    )
    stall_cells = []
    for b in ("sqlite", "postgres"):
        large = fig("stall", f"{b}.keel_stall_ms_{stall_size}")
        stall_cells.append(
            "n/a"
            if large is None
            else f"{large:.1f} ms, median round "
            f"{_fig(fig('stall', f'{b}.keel_stall_median_ms_{stall_size}'), 1)} ms (1 KB: "
            f"{_fig(fig('stall', f'{b}.keel_stall_ms_1000'), 1)}, "
            f"{_fig(fig('stall', f'{b}.keel_stall_median_ms_1000'), 1)} ms)"
        )
    issue12.append(
        [
            f"Worker loop's longest stall with a {stall_label} state beside other runs",
            *stall_cells,
            "no bound in the issue: compare with the 1 KB mix (case 6b)",
        ]
    )
    issue6 = [
        row("Console pages with 10,000 runs < 200 ms (slowest page's median)",
            "console", "console_slowest_ms", lambda v: v < 200, 1, " ms"),
        row("An effect adds ≤ ~3 commit floors of time",
            "effect", "effect_extra_floors", at_most(3.5), 1),
        row("2-worker Keel drain ≥ 2x DBOS, 2 DBOS workers",
            "drain", "keel2_vs_dbos2", lambda v: v >= 2.0),
    ]  # fmt: skip
    ttl = fig("takeover", "ttl")
    issue6.append(
        row(
            f"Takeover latency median ≤ TTL + 0.5 s (TTL {_fig(ttl, 0)} s)",
            "takeover",
            "takeover_median",
            lambda v: ttl is not None and v <= ttl + 0.5,
            2,
            " s",
        )
    )
    runs = ", ".join(f"{m:,}" for m in settings.memory_runs.values())
    issue6.append(
        row(
            f"Worker RSS growth < 10% (over {runs} runs, not 10,000)",
            "memory",
            "rss_growth_pct",
            lambda v: v < 10.0,
            1,
            "%",
        )
    )
    columns = ["target", "SQLite", "PostgreSQL", "status"]
    issue34 = [
        row("A `keel worker` draining a backlog, Keel/raw ≤ 0.7 (case 4b)",
            "drain-ratio", "drain_ratio", at_most(0.7)),
        row("In-process 5-step run, Keel/raw ≤ 0.6 (SQLite), ≤ 0.75 (PostgreSQL) (case 1)",
            "step", "keel_raw_ratio", {"sqlite": at_most(0.6), "postgres": at_most(0.75)}),
        row("No regression of the approval cycle: ≤ 1.0x raw interrupt/resume (case 3)",
            "approval", "approval_ratio", at_most(1.0)),
        row("No regression of the effect cost: ≤ 2 durable commits with its record (case 2)",
            "effect", "effect_extra_commits", at_most(2.0), 1),
        row("No regression of the drain against DBOS: 2 Keel workers ≥ 2x 1 DBOS (case 4)",
            "drain", "keel2_vs_dbos1", {"postgres": lambda v: v >= 2.0}),
    ]  # fmt: skip
    issue34 += curve_rows(results, settings, fig, row, per_run)
    acc = results.get("accumulate")
    if acc is not None:
        labels = sorted({k.split(".", 2)[2] for k in acc.figures if ".run_vs_base." in k})
        for what in ("run", "claim"):
            worst = {
                b: max((fig("accumulate", f"{b}.{what}_vs_base.{lab}") or 0.0) for lab in labels)
                for b in ("sqlite", "postgres")
            }
            for b, v in worst.items():
                acc.figures[f"{b}.{what}_worst"] = v
            issue34.append(
                row(f"{what.capitalize()} cost flat as runs accumulate: largest level ≤ 1.2x the "
                    "smallest (case 15)", "accumulate", f"{what}_worst", at_most(1.2))
            )  # fmt: skip
    tables = [
        Table("Targets (issue 12)", columns, issue12, TARGETS_NOTE),
        Table("Targets kept from issue 6", columns, issue6),
    ]
    if any(r[3] != "n/a" for r in issue34):
        tables.insert(0, Table("Targets (issue 34)", columns, issue34))
    return tables


def curve_rows(
    results: dict[str, CaseResult],
    settings: Settings,
    fig: Callable[[str, str], float | None],
    row: Callable[..., list[str]],
    per_run: dict[str, Check],
) -> list[list[str]]:
    """Issue 34's curves, at their far end: state size, fan-out width, workers, waits."""
    out: list[list[str]] = []

    def info(label: str, case: str, key: str, digits: int = 2, unit: str = "") -> list[str]:
        values = [_fig(fig(case, f"{b}.{key}"), digits, unit) for b in ("sqlite", "postgres")]
        return [label, *values, "no bound in the issue: a curve (see its case)"]

    sizes = (*settings.state_sizes, *settings.state_large)
    if sizes and results.get("state"):
        big = max(sizes)
        label = f"{big / 1e6:g} MB" if big >= 1_000_000 else f"{big // 1000} KB"
        out.append(info(f"Keel/raw per step with a {label} state (case 6)", "state",
                        f"state_ratio_{big}"))  # fmt: skip
    if results.get("fanout"):
        width = max(graphs.FAN_WIDTHS)
        out.append(row(f"Keel/raw, {width}-way Send fan-out (issue 12's bound; case 1c)",
                       "fanout", f"fanout{width}_ratio", per_run))  # fmt: skip
    if (drain := results.get("drain")) is not None:
        cells = []
        for b in ("sqlite", "postgres"):
            knee, best = fig("drain", f"{b}.knee_workers"), fig("drain", f"{b}.keel_best_rate")
            ceiling = fig("drain", f"{b}.db_ceiling_parallel") or fig("drain", f"{b}.db_ceiling")
            cells.append(
                "n/a"
                if knee is None or best is None
                else f"{knee:.0f} worker(s), {best:.0f} runs/s (database alone: "
                f"{_fig(ceiling, 0)} runs/s)"
            )
        if any(c != "n/a" for c in cells) and drain.figures:
            out.append(["Keel drain: where more workers stop paying (case 4)", *cells,
                        "no bound in the issue: where this machine saturates"])  # fmt: skip
    if results.get("memory"):
        out.append(info("Worker RSS idle (case 7)", "memory", "rss_idle_mib", 1, " MiB"))
        out.append(info(f"Worker RSS per run in flight ({settings.memory_inflight} at once)",
                        "memory", "rss_per_inflight_kib", 0, " KiB"))  # fmt: skip
        out.append(row("Worker RSS per waiting run ≈ 0 (judged: ≤ 1 KiB)", "memory",
                       "rss_per_waiting_bytes", lambda v: v <= 1024, 0, " B"))  # fmt: skip
    return out


def commit_reading(results: dict[str, CaseResult]) -> list[str]:
    """Per-run time of case 1, read as commits: how much of it the disk explains."""
    step, floor = results.get("step"), results.get("floor")
    if not step or not floor:
        return []
    lines = []
    for backend in ("sqlite", "postgres"):
        f = floor.figures.get(f"{backend}.floor_ms")
        if not f:
            continue
        parts = []
        for who in ("raw", "keel"):
            ms = step.data.get(f"{backend}.{who}")
            commits = step.figures.get(f"{backend}.{who}_commits")
            if isinstance(ms, Summary) and commits:
                parts.append(
                    f"{'Keel' if who == 'keel' else 'raw LangGraph'} {ms.median:.1f} ms/run = "
                    f"{ms.median / f:.0f} commit floors for {commits:.1f} commits"
                )
        if parts:
            lines.append(f"- {backend} (floor {f:.2f} ms): " + "; ".join(parts) + ".")
    return lines


def write(
    results: dict[str, CaseResult],
    errors: dict[str, str],
    settings: Settings,
    out: Path,
    plots_dir: Path | None,
    elapsed: float,
    notes: list[str],
    loads: list[float],
) -> None:
    plots: dict[str, list[tuple[str, str]]] = {}
    if plots_dir is not None:
        from bench import plots as plotting

        try:
            plots = plotting.draw(results, plots_dir)
        except ImportError as exc:
            notes.append(f"No plots: matplotlib is not installed ({exc}).")
        except Exception as exc:  # a broken plot must not lose the figures
            notes.append(f"No plots: drawing them failed ({type(exc).__name__}: {exc}).")
    lines = [
        "# Benchmarks: Keel vs raw LangGraph vs DBOS",
        "",
        f"_Written by `make bench` (`python -m bench{' --quick' if settings.quick else ''}`) "
        f"on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC in {elapsed / 60:.1f} minutes. Every "
        "figure below comes from that one run on the machine described here; do not edit by "
        "hand, run `make bench` again._",
        "",
    ]
    if settings.quick:
        lines += ["**Quick mode: a smoke run with tiny batches. These figures are noise.**", ""]
    for table in targets(results, settings):
        lines += _table(table)
    if step := results.get("step"):
        # Issue 12's table, up front: what one run asks of the database.
        for table in step.tables:
            if table.title.startswith("5-node chain: database traffic"):
                lines += _table(table)
    reading = commit_reading(results)
    if reading:
        lines += ["**Reading per-run time in commits**", "", *reading, ""]
    for note in notes:
        lines += [f"> {note}", ""]
    if errors:
        lines += ["## Cases that failed", ""]
        lines += [f"- **{case}**: `{msg}`" for case, msg in errors.items()]
        lines.append("")
    lines += ["## Machine and versions", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in machine_facts(settings, loads)]
    lines += [
        "",
        "## Method",
        "",
        "- **Same run, interleaved.** Within a case, contenders take turns one run each "
        "(A B C, then C B A, ...; the drain and floor cases: one batch each), after warm-up "
        "rounds that are not counted, on the same machine in the same minutes, so drift in "
        "disk or CPU speed hits all of them alike. Figures are medians with the min-max spread "
        "in parentheses; ratios are the median (min-max) of per-round ratios.",
        "- **Each contender has its own database** (a fresh SQLite file in WAL mode with "
        "`synchronous=FULL`, next to the repository on the same disk as PostgreSQL's data; or "
        "a fresh PostgreSQL database `keel_bench_*`, dropped at the end).",
        "- **Keel runs are measured end to end**: from just before `app.submit` to the run's "
        "`finished_at`, executed by a standing in-process worker at concurrency 1 (so "
        "admission, claim, every fenced step and completion are in). The end is seen in the "
        "worker's own count of ended executions, glanced at every 2 ms, and only then is the "
        "run read, from a second App on the same database: nothing queries the database or "
        "holds the interpreter beside the run while it executes (as nothing does beside raw "
        "LangGraph), and the time is the run's own `finished_at`. Raw "
        'LangGraph runs are `ainvoke(..., durability="sync")` with the official async saver, '
        "a new thread each.",
        "- **Traffic is counted, not estimated** (bench/wire.py), in separate untimed "
        "batches of two sizes whose difference cancels per-batch costs (connecting, a "
        "worker's start and stop), and only on the measured client's own connections. "
        "SQLite: every connection the client opens on its file gets a trace callback that "
        "counts statements (BEGIN and COMMIT included; trigger bodies not) and commits, "
        "`wrote` (durable) being those whose transaction wrote, the ones that cost an fsync. "
        "PostgreSQL: the client connects through a counting TCP proxy on 127.0.0.1 that reads "
        "the protocol's message boundaries: a round trip is each time the client sends after "
        "the server answered its previous send (a pipeline sent in one go is one; connection "
        "start-up and authentication are not counted), pool checks are psycopg_pool's empty "
        "queries, transactions are the returns to idle after a statement (an empty query is "
        "an empty transaction, as in pg_stat_database), and `wrote` those committed after a "
        "statement that modified, locked or notified (judged from command tags and, for a "
        "SELECT, its text). The drain case, whose clients are other processes, still reads "
        "the database's `xact_commit`.",
        "- **The floor** (case 8) is one durable commit; `in commit floors` columns divide a "
        "time by it.",
        "- Other work on the machine (this is a shared 2-core development box) shows up as "
        "spread; the min-max columns say how much.",
        "",
    ]
    from bench.__main__ import CASES

    for key in CASES:
        res = results.get(key)
        if res is None:
            continue
        lines += [f"## {res.title}", "", res.method, ""]
        for table in res.tables:
            lines += _table(table)
        for note in res.notes:
            lines += [f"- {note}"]
        if res.notes:
            lines.append("")
        for name, caption in plots.get(key, []):
            rel = os.path.relpath(plots_dir / name, out.parent) if plots_dir else name
            lines += [f"![{caption}]({rel})", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines).rstrip() + "\n")
