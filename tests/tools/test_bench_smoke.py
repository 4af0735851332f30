"""The bench's quick mode runs one case end to end on SQLite and reports real numbers.

No timing assertions: only that the case ran, measured, counted commits and wrote its table.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.__main__ import main

NUMBER = re.compile(r"^\d+(\.\d+)?( \(\d+(\.\d+)?-\d+(\.\d+)?\))?$")


def _rows(report: str, title: str) -> list[list[str]]:
    lines = report.split(f"**{title}", 1)[1].splitlines()
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
    assert re.search(r"Keel/raw LangGraph per 5-step run.*\| \d+\.\d+ \|", report)
    traffic = {
        row[0]: row
        for row in _table(report, "5-node chain: database traffic per run")
        if row[0] == "Keel" or row[0].startswith("raw")
    }
    assert len(traffic) == 2
    for row in traffic.values():
        assert float(row[1]) > 0 and float(row[2]) > 0  # SQLite statements, durable commits
        assert row[3] == row[4] == "n/a"  # PostgreSQL was not measured


def _table(report: str, title: str) -> list[list[str]]:
    lines = report.split(f"**{title}", 1)[1].splitlines()
    rows = []
    for line in lines[4:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_quick_shape_stall_and_idle_cases_report_numbers(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    code = main(
        [
            "--quick",
            "--cases",
            "shape,stall,idle",
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
    shapes = {row[1]: row for row in _table(report, "Time per run by shape")}
    assert set(shapes) == {"5-node chain", "20-node chain", "4-way Send fan-out"}
    for row in shapes.values():
        assert NUMBER.match(row[3]) and NUMBER.match(row[4]), row  # raw and Keel ms/run
        assert NUMBER.match(row[6]), row  # Keel/raw
    traffic = {row[0]: row for row in _table(report, "Database traffic per run by shape")}
    # A 20-node chain does more work than a 5-node one, for both contenders.
    five = [float(x) for x in traffic["5-node chain"][1].split()[0:3:2]]
    twenty = [float(x) for x in traffic["20-node chain"][1].split()[0:3:2]]
    assert twenty[0] > five[0] > 0 and twenty[1] > five[1] > 0
    stalls = {row[1]: row for row in _table(report, "Longest stall of the loop")}
    assert set(stalls) == {"Keel", "raw LangGraph"}
    for row in stalls.values():
        # "longest (median round)" and the p99, in ms, for each state size
        assert all(float(cell.split()[0]) >= 0 for cell in row[2:]), row
    idle = _table(report, "An idle worker's traffic per second")
    assert len(idle) == 1 and idle[0][1].endswith("statements")
    assert re.search(r"An idle worker makes .*\| \d+\.\d+ \|", report)


def test_quick_approval_case_reports_numbers(tmp_path: Path) -> None:
    # The case drains the runs to their waits first: a worker whose runs end `waiting` is
    # what it expects (it failed when WorkerStats began counting those apart).
    out = tmp_path / "bench.md"
    code = main(
        ["--quick", "--cases", "approval", "--backends", "sqlite", "--out", str(out),
         "--no-plots", "--tmp", str(tmp_path / "dbs")]
    )  # fmt: skip
    assert code == 0
    report = out.read_text()
    assert "## Cases that failed" not in report
    rows = {row[1]: row for row in _table(report, "One approval cycle")}
    assert set(rows) == {"raw interrupt/resume", "Keel approval"}
    for row in rows.values():
        assert NUMBER.match(row[2]), row  # ms/cycle
        assert float(row[3].split()[0]) > 0 and float(row[4]) > 0  # commits, statements
