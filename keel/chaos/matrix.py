"""The crash matrix: kill a worker at every fault point a clean run reaches, and check that the
run still ends as the clean run did, with the outside world having seen each effect once.

A run of the workflow goes through *phases*: phase 0 until its first wait is answered, phase 1
until the second, and so on; each phase is one worker process in a clean run. The clean run
records, per phase, how often each fault point was reached. Then every (phase, point,
occurrence) becomes a cell of each configured fault kind (keel.chaos.kinds): a fresh
database, a worker armed at that occurrence (killed there, or held there while the fault hits
the world), fresh workers until the run finishes (answering its waits as told), and the
invariant checks of `keel.chaos.checks`.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from keel.chaos.checks import compare
from keel.chaos.harness import Cell, ChaosConfig, Harness, Report
from keel.chaos.kinds import fault_kinds
from keel.testing.http import HttpSink
from keel.testing.smtp import SmtpSink


def _read_reached(record: Path) -> list[dict[str, int]]:
    """Per phase, how often the clean run reached each point (`.N`: worker processes of phase
    N; `.dN`: the decision that ends phase N, which can only reach decision.after_record)."""
    phases: dict[int, dict[str, int]] = {}
    for path in record.parent.glob(record.name + ".*"):
        suffix = path.name.rsplit(".", 1)[-1]
        phase = int(suffix.removeprefix("d"))
        for line in path.read_text().splitlines():
            reached = json.loads(line)["reached"]
            if suffix.startswith("d"):
                reached = {k: v for k, v in reached.items() if k == "decision.after_record"}
            bucket = phases.setdefault(phase, {})
            for point, count in reached.items():
                bucket[point] = bucket.get(point, 0) + count
    return [phases.get(i, {}) for i in range(max(phases) + 1)] if phases else []


def _occurrences(count: int, cap: int | None) -> list[int]:
    if cap is None or count <= cap:
        return list(range(1, count + 1))
    if cap == 1:
        return [1]
    step = (count - 1) / (cap - 1)
    return sorted({round(1 + i * step) for i in range(cap)})


def run_matrix(
    config: ChaosConfig,
    *,
    on_cell: Callable[[Cell], None] | None = None,
    soak: int = 0,
    matrix: bool = True,
) -> Report:
    """Run the clean run, then every cell; return the report (see keel.chaos.report)."""
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="keel-chaos-") as tmp,
        SmtpSink(spool=Path(tmp) / "spool") as smtp,
        HttpSink() as http,
        fault_kinds(config) as kinds,
    ):
        root = Path(config.workdir or tmp)
        root.mkdir(parents=True, exist_ok=True)
        harness = Harness(config, smtp, http, root, kinds)
        record = root / "reached"
        clean = harness.execute(None, record=record)
        reached = _read_reached(record)
        cells = (
            [
                Cell(phase, point, occurrence, fault=name)
                for name, kind in kinds.items()
                for phase, points in enumerate(reached)
                for point, count in sorted(points.items())
                if (not config.points or point in config.points) and kind.applies(point)
                for occurrence in _occurrences(count, config.max_occurrences)
            ]
            if matrix
            else []
        )
        for cell in cells:
            t0 = time.monotonic()
            try:
                outcome = harness.execute(cell)
            except TimeoutError as exc:
                cell.verdict, cell.problems = "fail", [str(exc)]
            else:
                if not outcome.killed:
                    cell.verdict = "not_reached"
                else:
                    cell.problems = compare(clean, outcome)
                    cell.verdict = "fail" if cell.problems else "pass"
            cell.seconds = time.monotonic() - t0
            if on_cell is not None:
                on_cell(cell)
        soak_problems: list[str] = []
        if soak:
            from keel.chaos.soak import run_soak

            soak_problems = run_soak(harness, clean, soak)
    return Report(config, clean, reached, cells, soak_problems, time.monotonic() - started)
