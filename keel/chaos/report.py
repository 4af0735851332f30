"""The matrix as a rich table, a JSON report and a JUnit XML file for CI: the same fields in
each (where a cell struck, what the outside world saw against the clean run, the likely cause)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any
from xml.etree import ElementTree as ET

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from keel.chaos.harness import Cell, Report

MARK = {
    "pass": "[green]✓[/]",
    "fail": "[bold red]✗[/]",
    "not_reached": "[dim]·[/]",
    "skipped": "[dim]-[/]",
}


FULL_WIDTH = 240


def output_console(file: IO[str] | None = None) -> Console:
    """A console for the report: the terminal's width in a terminal; piped to a file or a CI
    log, wide enough that neither the table nor a cause is cut at 80 columns."""
    console = Console(file=file)
    if console.is_terminal:
        return console
    return Console(file=file, width=max(console.width, FULL_WIDTH))


def summary(report: Report) -> str:
    """The verdict line's count of cells: what ran, what sampling skipped, the risky ones."""
    ran, total, risky = len(report.cells), len(report.cells) + len(report.skipped), report.risky
    after = (
        f"the {len(risky)} after outside deliveries all run"
        if risky
        else "no cell follows an outside delivery"
    )
    if report.skipped:
        return f"{ran} of {total} cells run ({len(report.skipped)} skipped by sampling); {after}"
    return f"{ran} of {total} cells run; {after}"


def render(report: Report, console: Console) -> None:
    rows: dict[tuple[str, int, str], dict[int, str]] = {}
    for cell in [*report.cells, *report.skipped]:
        rows.setdefault((cell.kind, cell.phase, cell.point), {})[cell.occurrence] = cell.verdict
    width = max((max(r) for r in rows.values()), default=0)
    table = Table(title=f"keel chaos: {report.config.workflow} on {report.config.backend}")
    table.add_column("fault")
    table.add_column("phase", justify="right")
    table.add_column("fault point")
    for n in range(1, width + 1):
        table.add_column(str(n), justify="center")
    order = {name: i for i, name in enumerate(report.config.faults)}
    for (kind, phase, point), verdicts in sorted(
        rows.items(), key=lambda row: (order.get(row[0][0], len(order)), row[0][1:])
    ):
        marks = (MARK.get(verdicts.get(n, ""), "") for n in range(1, width + 1))
        table.add_row(kind, str(phase), point, *marks)
    console.print(table)
    console.print("✓ pass  ✗ fail  · not reached  - skipped by sampling", style="dim")
    clean = report.clean
    console.print(
        escape(
            f"clean run: {clean.status} / {clean.decision} / {clean.termination_reason}; "
            f"effects {clean.effects}; outside world {clean.world}; "
            f"artifacts {sorted(clean.artifacts)}"
        )
    )
    for cell in report.cells:
        if cell.verdict == "fail":
            console.print(f"[bold red]✗ {escape(cell.name)}[/]: {escape(cell.where or '?')}")
            for problem in cell.problems:
                console.print(f"    {escape(problem)}")
            if cell.extra:
                console.print(
                    f"    outside world, beyond the clean run: {escape('; '.join(cell.extra))}"
                )
            if cell.cause:
                console.print(f"    [bold]likely cause[/]: {escape(cell.cause)}")
    if report.skipped:
        console.print(
            "skipped by sampling: " + ", ".join(escape(c.name) for c in report.skipped),
            style="dim",
            soft_wrap=True,
        )
    for problem in report.soak:
        console.print(f"[bold red]✗ soak:[/] {escape(problem)}")
    counts = {v: sum(c.verdict == v for c in report.cells) for v in ("pass", "fail", "not_reached")}
    verdict = "[green]all invariants held[/]" if report.ok else "[bold red]violations found[/]"
    console.print(
        f"{summary(report)}: {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['not_reached']} not reached, in {report.seconds:.1f}s "
        f"({report.cells_per_minute:.1f} cells/min, {report.config.jobs} at once) — {verdict}"
    )


_NAMES = (
    "name kind phase point occurrence verdict where node task_path effect after_deliveries "
    "problems world extra_deliveries cause"
)
CELL_FIELDS = tuple(_NAMES.split())
"""What the JSON and JUnit reports say of a cell, in this order, and then its seconds."""


def cell_fields(cell: Cell) -> dict[str, Any]:
    fields = {n: getattr(cell, "extra" if n == "extra_deliveries" else n) for n in CELL_FIELDS}
    fields["seconds"] = round(cell.seconds, 2)
    return fields


def as_json(report: Report) -> dict[str, Any]:
    clean = {k: v for k, v in report.clean.__dict__.items() if k != "deliveries"}
    clean["deliveries"] = [d.as_dict() for d in report.clean.deliveries]
    return {
        "workflow": report.config.workflow,
        "backend": report.config.backend,
        "decide": report.config.decide,
        "faults": list(report.config.faults),
        "ok": report.ok,
        "summary": summary(report),
        "seconds": round(report.seconds, 2),
        "matrix_seconds": round(report.matrix_seconds, 2),
        "cells_per_minute": round(report.cells_per_minute, 1),
        "jobs": report.config.jobs,
        "clean": clean,
        "reached": report.reached,
        "cells": [cell_fields(c) for c in report.cells],
        "skipped": [cell_fields(c) for c in report.skipped],
        "soak": report.soak,
    }


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(as_json(report), indent=2, default=str) + "\n")


def write_junit(report: Report, path: Path) -> None:
    everything = [*report.cells, *report.skipped]
    suite = ET.Element(
        "testsuite",
        name=f"keel-chaos.{report.config.workflow}.{report.config.backend}",
        tests=str(len(everything) + (1 if report.soak else 0)),
        failures=str(sum(c.verdict == "fail" for c in report.cells) + (1 if report.soak else 0)),
        skipped=str(sum(c.verdict in ("not_reached", "skipped") for c in everything)),
        time=f"{report.seconds:.2f}",
    )
    for cell in everything:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"keel.chaos.{report.config.workflow}.{cell.kind}",
            name=cell.name,
            time=f"{cell.seconds:.2f}",
        )
        props = ET.SubElement(case, "properties")
        for key, value in cell_fields(cell).items():
            if key not in ("name", "problems", "seconds") and value not in ("", [], {}):
                text = value if isinstance(value, str) else json.dumps(value)
                ET.SubElement(props, "property", name=key, value=str(text))
        if cell.verdict == "fail":
            lines = [f"at {cell.where}", *cell.problems]
            if cell.extra:
                lines.append("outside world, beyond the clean run: " + "; ".join(cell.extra))
            if cell.cause:
                lines.append(f"likely cause: {cell.cause}")
            ET.SubElement(case, "failure", message=cell.problems[0]).text = "\n".join(lines)
        elif cell.verdict == "not_reached":
            ET.SubElement(case, "skipped", message="the armed point was not reached")
        elif cell.verdict == "skipped":
            ET.SubElement(case, "skipped", message="not sampled (--max-occurrences)")
    if report.soak:
        case = ET.SubElement(suite, "testcase", classname="keel.chaos.soak", name="soak")
        ET.SubElement(case, "failure", message=report.soak[0]).text = "\n".join(report.soak)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
