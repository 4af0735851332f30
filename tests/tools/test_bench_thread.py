"""The bench's long-thread case in quick mode: a dozen turns on one thread, on SQLite.

No timing assertions: only that both contenders ran every turn, that each figure the case
reports is a number, and that the traffic it counts is real (a turn costs the same statements
late on a thread as on a new one, and Keel's turns write as many durable commits as it says).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.case_thread import window
from bench.common import CaseResult
from tests.tools.test_bench_smoke import NUMBER, _table


def test_the_windows_are_the_issues_turns() -> None:
    assert [list(window(m, 200, 5)) for m in (1, 50, 200)] == [
        [1, 2, 3, 4, 5],
        [48, 49, 50, 51, 52],
        [196, 197, 198, 199, 200],
    ]
    assert [list(window(m, 12, 3)) for m in (1, 6, 12)] == [[1, 2, 3], [5, 6, 7], [10, 11, 12]]


def test_quick_thread_case_reports_numbers(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    code = main(
        ["--quick", "--cases", "thread", "--backends", "sqlite", "--out", str(out),
         "--no-plots", "--tmp", str(tmp_path / "dbs")]
    )  # fmt: skip
    assert code == 0
    report = out.read_text()
    assert "## Cases that failed" not in report
    assert "## 12. Long threads" in report

    steps = {row[1]: row for row in _table(report, "ms per step by turn, one 12-turn thread")}
    assert set(steps) == {"raw LangGraph", "Keel"}
    for row in steps.values():
        assert row[0] == "sqlite"
        assert all(NUMBER.match(cell) for cell in row[2:5]), row  # turns 1, 6, 12
        assert float(row[5]) > 0  # turn 12 / turn 1
    assert all(NUMBER.match(cell) for cell in steps["Keel"][6:9]), steps["Keel"]  # Keel/raw

    (reads,) = _table(report, "Reading a 12-turn thread back (ms), and what the thread wrote")
    assert all(NUMBER.match(cell) for cell in reads[1:5]), reads
    # 24 messages of ~150 characters: some KB, and both databases grew by writing them.
    assert float(reads[5].replace(",", "")) >= 3
    assert float(reads[6]) > 0 and float(reads[7]) > 0

    traffic = {row[1]: row for row in _table(report, "Database traffic per turn")}
    assert set(traffic) == {"raw LangGraph", "Keel"}
    for row in traffic.values():
        counted = [re.findall(r"\d+\.\d", cell) for cell in row[2:4]]
        for statements, durable in counted:
            assert float(statements) > float(durable) > 0
    # What raw LangGraph's turn asks of its database does not depend on how long the thread
    # is (Keel's counts also take in its worker's polls, which vary with timing).
    raw_new, raw_long = traffic["raw LangGraph"][2:4]
    assert raw_new == raw_long

    targets = {row[0]: row for row in _table(report, "Targets (issue 31)")}
    assert len(targets) == 6
    for row in targets.values():
        assert re.fullmatch(r"\d+\.\d\d", row[1]), row  # SQLite's figure
        assert row[2] == "n/a"  # PostgreSQL was not measured


def test_the_thread_plot_draws_each_contenders_turns(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the bench extra's; `make bench` installs it
    from bench import plots

    result = CaseResult("thread", "12. Long threads", "")
    result.data["sqlite.turns"] = {"raw": [4.0, 4.5, 5.0], "keel": [5.0, 5.5, 6.0]}
    drawn = plots.draw({"thread": result}, tmp_path)
    assert [name for name, _ in drawn["thread"]] == ["thread.png"]
    assert (tmp_path / "thread.png").read_bytes().startswith(b"\x89PNG")
