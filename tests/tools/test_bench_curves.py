"""Issue 34's fan-out curve in quick mode: the case runs every width and counts its traffic.

No timing assertions, as in test_bench_smoke: only that it measured and wrote its tables.
"""

from __future__ import annotations

from pathlib import Path

from bench.__main__ import main
from tests.tools.test_bench_smoke import NUMBER, _table


def test_quick_fanout_case_reports_every_width(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    code = main(
        ["--quick", "--cases", "fanout", "--backends", "sqlite", "--out", str(out),
         "--no-plots", "--tmp", str(tmp_path / "dbs")]
    )  # fmt: skip
    assert code == 0
    report = out.read_text()
    assert "## Cases that failed" not in report
    times = {row[1]: row for row in _table(report, "Time per run by fan-out width")}
    assert set(times) == {"1", "10", "100"}
    for row in times.values():
        assert NUMBER.match(row[2]) and NUMBER.match(row[3]), row  # raw and Keel ms/run
        assert NUMBER.match(row[6]), row  # Keel/raw
    traffic = {row[0]: row for row in _table(report, "Database traffic per run by fan-out")}
    # Raw LangGraph's saver writes each task's result in its own commit: more with width.
    raw = {w: float(traffic[w][2].split(" / ")[1]) for w in ("1", "100")}
    assert raw["100"] > raw["1"] > 0
    assert float(traffic["1"][2].split(" / ")[0]) > 0  # Keel's durable commits
