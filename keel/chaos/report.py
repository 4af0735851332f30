"""The matrix as a rich table, a JSON report and a JUnit XML file for CI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from rich.console import Console
from rich.table import Table

from keel.chaos.harness import Report

MARK = {"pass": "[green]✓[/]", "fail": "[bold red]✗[/]", "not_reached": "[dim]·[/]"}


def render(report: Report, console: Console) -> None:
    rows: dict[tuple[str, int, str], dict[int, str]] = {}
    for cell in report.cells:
        rows.setdefault((cell.fault, cell.phase, cell.point), {})[cell.occurrence] = cell.verdict
    width = max((max(r) for r in rows.values()), default=0)
    table = Table(title=f"keel chaos: {report.config.workflow} on {report.config.backend}")
    table.add_column("fault")
    table.add_column("phase", justify="right")
    table.add_column("fault point")
    for n in range(1, width + 1):
        table.add_column(str(n), justify="center")
    order = {name: i for i, name in enumerate(report.config.faults)}
    for (fault, phase, point), verdicts in sorted(
        rows.items(), key=lambda row: (order.get(row[0][0], len(order)), row[0][1:])
    ):
        marks = (MARK.get(verdicts.get(n, ""), "") for n in range(1, width + 1))
        table.add_row(fault, str(phase), point, *marks)
    console.print(table)
    clean = report.clean
    console.print(
        f"clean run: {clean.status} / {clean.decision} / {clean.termination_reason}; "
        f"effects {clean.effects}; outside world {clean.world}; artifacts {sorted(clean.artifacts)}"
    )
    for cell in report.cells:
        if cell.verdict == "fail":
            console.print(f"[bold red]✗ {cell.name}[/]")
            for problem in cell.problems:
                console.print(f"    {problem}")
    for problem in report.soak:
        console.print(f"[bold red]✗ soak:[/] {problem}")
    counts = {v: sum(c.verdict == v for c in report.cells) for v in ("pass", "fail", "not_reached")}
    verdict = "[green]all invariants held[/]" if report.ok else "[bold red]violations found[/]"
    console.print(
        f"{len(report.cells)} cells: {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['not_reached']} not reached, in {report.seconds:.1f}s — {verdict}"
    )


def as_json(report: Report) -> dict[str, Any]:
    return {
        "workflow": report.config.workflow,
        "backend": report.config.backend,
        "decide": report.config.decide,
        "faults": list(report.config.faults),
        "ok": report.ok,
        "seconds": round(report.seconds, 2),
        "clean": report.clean.__dict__,
        "reached": report.reached,
        "cells": [
            {
                "fault": c.fault,
                "phase": c.phase,
                "point": c.point,
                "occurrence": c.occurrence,
                "verdict": c.verdict,
                "problems": c.problems,
                "seconds": round(c.seconds, 2),
            }
            for c in report.cells
        ],
        "soak": report.soak,
    }


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps(as_json(report), indent=2, default=str) + "\n")


def write_junit(report: Report, path: Path) -> None:
    suite = ET.Element(
        "testsuite",
        name=f"keel-chaos.{report.config.workflow}.{report.config.backend}",
        tests=str(len(report.cells) + (1 if report.soak else 0)),
        failures=str(sum(c.verdict == "fail" for c in report.cells) + (1 if report.soak else 0)),
        skipped=str(sum(c.verdict == "not_reached" for c in report.cells)),
        time=f"{report.seconds:.2f}",
    )
    for cell in report.cells:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"keel.chaos.{report.config.workflow}.{cell.fault}",
            name=cell.name,
            time=f"{cell.seconds:.2f}",
        )
        if cell.verdict == "fail":
            ET.SubElement(case, "failure", message=cell.problems[0]).text = "\n".join(cell.problems)
        elif cell.verdict == "not_reached":
            ET.SubElement(case, "skipped", message="the armed point was not reached")
    if report.soak:
        case = ET.SubElement(suite, "testcase", classname="keel.chaos.soak", name="soak")
        ET.SubElement(case, "failure", message=report.soak[0]).text = "\n".join(report.soak)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
