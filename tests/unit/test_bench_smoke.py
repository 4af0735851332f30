"""The bench's quick mode runs one case end to end on SQLite and reports real numbers.

No timing assertions: only that the case ran, measured, counted commits and wrote its table.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.__main__ import main

NUMBER = re.compile(r"^\d+(\.\d+)?( \(\d+(\.\d+)?-\d+(\.\d+)?\))?$")


def _rows(report: str, title: str) -> list[list[str]]:
    lines = report.split(f"**{title}**", 1)[1].splitlines()
    table = [line for line in lines[2:] if line.startswith("| sqlite |")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table]


def test_quick_step_case_reports_numbers(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    code = main(
        [
            "--quick",
            "--cases",
            "step",
            "--backends",
            "sqlite",
            "--out",
            str(out),
            "--no-plots",
            "--tmp",
            str(tmp_path / "dbs"),
        ]
    )
    assert code == 0
    report = out.read_text()
    assert "## Cases that failed" not in report
    rows = {row[1]: row for row in _rows(report, "5-node chain, per run")}
    assert set(rows) == {"no checkpointer", "raw LangGraph", "Keel"}
    for row in rows.values():
        assert NUMBER.match(row[2]), row  # ms/run, median (min-max)
        assert float(row[2].split()[0]) > 0
    # Commits are counted on the real connections: none without a checkpointer, some with one.
    commits = {name: float(row[6].split()[0]) for name, row in rows.items()}
    assert commits["no checkpointer"] == 0
    assert commits["raw LangGraph"] > 0
    assert commits["Keel"] > 0
    assert NUMBER.match(rows["Keel"][8]), rows["Keel"]  # the Keel/raw ratio
    assert re.search(r"Keel/raw LangGraph per run.*\| \d+\.\d+ \|", report)
