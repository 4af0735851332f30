"""The harness catches real bugs: duplicated emails and broken waits, at the right cells."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.chaos.harness import ChaosConfig
from keel.chaos.matrix import run_matrix

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_harness_reports_the_duplicate_email_of_a_send_outside_the_ledger() -> None:
    config = ChaosConfig(
        app="tests.support.apps.unsafe:app",
        workflow="direct-email",
        input={"to": "ana@example.com"},
        points=("checkpoint.before_write",),
        cwd=ROOT,
    )
    report = run_matrix(config)
    assert report.clean.world["smtp messages"] == 1
    assert not report.ok
    failed = [c for c in report.cells if c.verdict == "fail"]
    assert failed, "a crash between the send and its checkpoint must be caught"
    assert all("smtp messages: 2, clean run 1" in c.problems for c in failed)
    # Crashes before the send node ran, or after its checkpoint, are harmless: those cells pass.
    assert any(c.verdict == "pass" for c in report.cells)
    first_bad = min(c.occurrence for c in failed)
    assert all(c.verdict == "pass" for c in report.cells if c.occurrence < first_bad)


@pytest.mark.slow
def test_harness_reports_the_extra_wait_announced_under_a_random_id() -> None:
    config = ChaosConfig(
        app="tests.support.apps.unsafe:app",
        workflow="random-wait",
        input={},
        points=("wait.after_interrupt",),
        cwd=ROOT,
    )
    report = run_matrix(config)
    # Even the clean run announces twice (the node re-runs when the decision resumes it) ...
    assert report.clean.world["http deliveries"] == 2
    [cell] = report.cells
    # ... and a crash right after the interrupt announces a third request nobody will answer.
    assert cell.verdict == "fail"
    assert "http deliveries: 3, clean run 2" in cell.problems
