"""The crash harness on outbox effects: the dispatcher is killed at its own fault points
(before, after the provider call, after its record) and every cell delivers each intent once,
reconciled, resent under the same id, or answered as a person would when in doubt."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.chaos.harness import ChaosConfig
from keel.chaos.matrix import run_matrix

ROOT = Path(__file__).resolve().parents[2]
OUTBOX_POINTS = ("outbox.before_call", "outbox.after_call", "outbox.after_settle")


@pytest.mark.slow
@pytest.mark.parametrize("effect", ["reconciled", "blind"])
def test_the_dispatcher_killed_at_its_fault_points_delivers_each_intent_once(
    effect: str,
) -> None:
    report = run_matrix(
        ChaosConfig(
            app="tests.support.apps.outbox:app",
            workflow="outbox",
            input={"count": 2, "effect": effect},
            backend="sqlite",
            env={"OUTBOX_URL": "{http_url}"},
            cwd=ROOT,
            jobs=2,
            points=OUTBOX_POINTS,
            # Each point's first occurrence, and every cell right after a delivery (sampling
            # never skips those): 4 and 5 cells of the 6 the whole matrix has.
            max_occurrences=1,
            # The suite's deadline for effects that declare none (tests/conftest.py), not the
            # harness's 5 s: a cell killed mid-call waits that long before it is reconciled.
            effect_timeout=2.0,
        )
    )
    assert report.clean.world["http deliveries"] == 2
    assert report.clean.effects == {f"outbox:send_{effect}": 2}
    assert {c.point for c in report.cells} >= set(OUTBOX_POINTS)
    problems = {c.name: c.problems for c in report.cells if c.verdict == "fail"}
    assert problems == {}
    assert report.ok
