"""The crash matrix: kill a worker at every fault point a clean run reaches, and check that the
run still ends as the clean run did, with the outside world having seen each effect once.

A run of the workflow goes through *phases*: phase 0 until its first wait is answered, phase 1
until the second, and so on; each phase is one worker process in a clean run. The clean run
records, per phase, every fault point it reached, in order, with the node running there
(keel.chaos.trace). Then every (phase, point, occurrence) becomes a cell: a fresh database and
outside world, a worker armed to SIGKILL itself at that occurrence, fresh workers until the run
finishes (answering its waits as told), and the invariant checks of `keel.chaos.checks`. With
`max_occurrences`, the cells right after each outside delivery always run; the rest are sampled
and the report lists those it skipped.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from keel.chaos.checks import Outcome, compare
from keel.chaos.harness import Cell, ChaosConfig, Harness, Report
from keel.chaos.kinds import FaultKind, fault_kinds
from keel.chaos.preflight import HarnessError
from keel.chaos.trace import Trace, build, sample
from keel.chaos.verdict import extra_deliveries, likely_cause


def plan(config: ChaosConfig, trace: Trace) -> tuple[list[Cell], list[Cell]]:
    """The cells to run and the cells sampling skips, in matrix order."""
    risky = trace.risky()
    counts: dict[tuple[int, str], int] = {}
    for o in trace.occurrences:
        if not config.points or o.point in config.points:
            counts[(o.phase, o.point)] = max(counts.get((o.phase, o.point), 0), o.occurrence)
    run, skipped = [], []
    for (phase, point), count in sorted(counts.items()):
        chosen = set(sample(count, config.max_occurrences))
        for n in range(1, count + 1):
            cell = Cell(phase, point, n)
            where = trace.find(phase, point, n)
            if where is not None:
                cell.where, cell.node, cell.task_path = where.where, where.node, where.path
                cell.effect = where.effect
                if not cell.node and where.after:
                    cell.node = ", ".join(where.after)
            made = risky.get((phase, point, n), [])
            senders = sorted({m.node for m in made if m.node})
            if where is not None and not where.node and senders and senders != where.after:
                # A point of no node of its own that a sending node's work overlapped (on
                # PostgreSQL a step's checkpoint may commit while the next node runs): name the
                # node that was running, the one a crash here makes run again.
                cell.node = ", ".join(senders)
                cell.where += " (while node " + ", ".join(f"`{n}`" for n in senders) + " ran)"
            cell.after_deliveries = [
                f"{m.delivery.what}" + (f" from node `{m.node}`" if m.node else "") for m in made
            ]
            if n in chosen or made:
                run.append(cell)
            else:
                cell.verdict = "skipped"
                skipped.append(cell)
    return run, skipped


def judge(cell: Cell, clean: Outcome, outcome: Outcome, trace: Trace) -> None:
    cell.world = outcome.world
    if not outcome.killed:
        cell.verdict = "not_reached"
        return
    cell.problems = compare(clean, outcome)
    cell.verdict = "fail" if cell.problems else "pass"
    extra = extra_deliveries(clean.deliveries, outcome.deliveries)
    cell.extra = [d.what + (f" (key {d.key})" if d.key else " (no key)") for d in extra]
    if cell.problems:
        cell.cause = likely_cause(clean, outcome, trace.deliveries, extra)


def run_matrix(
    config: ChaosConfig,
    *,
    on_cell: Callable[[Cell], None] | None = None,
    soak: int = 0,
    matrix: bool = True,
) -> Report:
    """Run the clean run, then the cells (`config.jobs` at once); return the report (see
    keel.chaos.report)."""
    started = time.monotonic()
    root = Path(config.workdir or tempfile.mkdtemp(prefix="keel-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    report: Report | None = None
    try:
        with fault_kinds(config) as kinds:
            harness = Harness(config, root, kinds)
            try:
                report = _run(config, harness, root, started, on_cell, soak, matrix)
                return report
            finally:
                harness.close()
    finally:
        # A failed matrix keeps its temporary work dir: the failed cells' logs/cell-N.log (named
        # in their problems) hold their workers' output and, for a hung one, its stacks.
        if config.workdir is None and report is not None and report.ok:
            shutil.rmtree(root, ignore_errors=True)


def per_kind(kinds: dict[str, FaultKind], cells: list[Cell]) -> list[Cell]:
    """The planned cells once per fault kind, where the kind applies to the point."""
    return [
        _as_kind(cell, name)
        for name, kind in kinds.items()
        for cell in cells
        if kind.applies(cell.point)
    ]


def _as_kind(cell: Cell, kind: str) -> Cell:
    copied = copy.deepcopy(cell)
    copied.kind = kind
    return copied


def _run(
    config: ChaosConfig,
    harness: Harness,
    root: Path,
    started: float,
    on_cell: Callable[[Cell], None] | None,
    soak: int,
    matrix: bool,
) -> Report:
    record = root / "reached"
    clean = harness.execute(None, record=record)
    trace = build(record, clean.deliveries)
    reached = _reached(trace)
    cells, skipped = plan(config, trace) if matrix else ([], [])
    cells, skipped = per_kind(harness.kinds, cells), per_kind(harness.kinds, skipped)

    def one(cell: Cell) -> Cell:
        t0 = time.monotonic()
        try:
            judge(cell, clean, harness.execute(cell), trace)
        except TimeoutError as exc:
            cell.verdict, cell.problems = "fail", [str(exc)]
            cell.cause = "the run did not finish: a wait nobody answers, or a stuck worker"
        except HarnessError as exc:
            cell.verdict, cell.problems = "fail", [str(exc)]
            cell.cause = "a worker gave up with an error of its own (its last line is above)"
        cell.seconds = time.monotonic() - t0
        if on_cell is not None:
            on_cell(cell)
        return cell

    t_matrix = time.monotonic()
    alone = [c for c in cells if harness.kinds[c.kind].exclusive]
    with ThreadPoolExecutor(max_workers=max(1, config.jobs)) as pool:
        list(pool.map(one, [c for c in cells if not harness.kinds[c.kind].exclusive]))
    for cell in alone:  # nothing else in flight while the server restarts
        one(cell)
    matrix_seconds = time.monotonic() - t_matrix
    soak_problems: list[str] = []
    if soak:
        from keel.chaos.soak import run_soak

        soak_problems = run_soak(harness, clean, soak)
    return Report(
        config,
        clean,
        reached,
        cells,
        soak_problems,
        time.monotonic() - started,
        skipped=skipped,
        matrix_seconds=matrix_seconds,
    )


def _reached(trace: Trace) -> list[dict[str, int]]:
    """Per phase, how often the clean run reached each point."""
    phases: list[dict[str, int]] = []
    for o in trace.occurrences:
        while len(phases) <= o.phase:
            phases.append({})
        phases[o.phase][o.point] = max(phases[o.phase].get(o.point, 0), o.occurrence)
    return phases
