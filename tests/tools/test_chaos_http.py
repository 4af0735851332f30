"""The crash harness on HTTP effects written from the docs: each cell gets its own outside world,
so a correct effect passes every cell; an unsafe one fails the cell right after its delivery,
even when sampling skips most cells, and the verdict names the node and the likely cause."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from keel.chaos.harness import ChaosConfig, Report
from keel.chaos.matrix import run_matrix
from keel.chaos.report import summary

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.support.apps.payments:app"


def _chaos(workflow: str, backend: str = "sqlite", **options: object) -> Report:
    postgres_url = None
    if backend == "postgres":
        postgres_url = os.environ.get("KEEL_TEST_POSTGRES_URL")
        if not postgres_url:
            if os.environ.get("KEEL_REQUIRE_POSTGRES") == "1":
                pytest.fail("KEEL_REQUIRE_POSTGRES=1 but KEEL_TEST_POSTGRES_URL is not set")
            pytest.skip("set KEEL_TEST_POSTGRES_URL")
    config = ChaosConfig(
        app=APP,
        workflow=workflow,
        input={"order": "A-1"},
        backend=backend,
        postgres_url=postgres_url,
        env={"PAYMENTS_URL": "{http_url}"},
        cwd=ROOT,
        # The suite's deadline for effects that declare none (tests/conftest.py), not the
        # harness's 5 s: a cell killed mid-charge waits that long before its key is reconciled.
        **{"jobs": 2, "effect_timeout": 2.0, **options},  # type: ignore[arg-type]
    )
    return run_matrix(config)


CORRECT = [
    pytest.param("pay-idempotent", "sqlite", id="provider-idempotent-sqlite"),
    pytest.param("pay-reconciled", "sqlite", id="reconciled-sqlite"),
    pytest.param(
        "pay-idempotent", "postgres", id="provider-idempotent-postgres", marks=pytest.mark.postgres
    ),
    pytest.param(
        "pay-reconciled", "postgres", id="reconciled-postgres", marks=pytest.mark.postgres
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("workflow", "backend"), CORRECT)
def test_a_correct_http_effect_passes_every_cell(workflow: str, backend: str) -> None:
    # Every fault point the run reaches, the first occurrence of each, and every cell right
    # after the charge (sampling never skips those): the cells an unsafe effect fails in.
    report = _chaos(workflow, backend, max_occurrences=1)
    # One charge; a reconciler's or a node's GET is a lookup, not a delivery.
    assert report.clean.world["http deliveries"] == 1
    assert report.clean.effects == {"charge": 1}
    problems = {c.name: c.problems for c in report.cells if c.verdict == "fail"}
    assert problems == {}
    assert report.ok
    # Only a heartbeat, which depends on timing, may be missed by the armed process.
    assert {c.point for c in report.cells if c.verdict == "not_reached"} <= {"lease.renew"}
    assert any(c.point == "effect.after_perform" for c in report.cells)
    assert report.risky, "the cells after the charge are the risky ones"


@pytest.mark.slow
def test_a_get_lookup_in_the_node_is_not_a_delivery() -> None:
    report = _chaos("pay-lookup-first", points=("effect.after_perform", "effect.after_record"))
    assert report.clean.world["http deliveries"] == 1  # the GET /customers was not counted
    assert [c.verdict for c in report.cells] == ["pass", "pass"]


TWICE = "http deliveries: 2, clean run 1"
UNSAFE = [
    pytest.param("pay-direct", "outside `@keel.effect`", TWICE, id="direct-post"),
    pytest.param(
        "pay-fresh-key", "the idempotency key is not stable", TWICE, id="fresh-key-per-attempt"
    ),
    # Keel refuses the replay (NondeterminismError): nothing is sent twice, the run fails.
    pytest.param(
        "pay-changing-args",
        "arguments changed between attempts",
        "status 'failed', clean run 'completed'",
        id="changed-arguments",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("workflow", "cause", "problem"), UNSAFE)
def test_an_unsafe_http_effect_fails_the_cell_after_it_even_when_sampling(
    workflow: str, cause: str, problem: str
) -> None:
    report = _chaos(workflow, max_occurrences=1)
    assert report.skipped, "sampling skipped cells"
    assert not report.ok
    failed = [c for c in report.cells if c.verdict == "fail"]
    risky_failed = [c for c in failed if c.after_deliveries]
    assert risky_failed, f"no failing cell right after the charge: {[c.name for c in failed]}"
    for cell in risky_failed:
        assert cell.node == "pay", cell.where
        assert "`pay`" in cell.where
        assert cause in cell.cause
        assert problem in cell.problems
        if problem == TWICE:
            assert any(e.startswith("POST /charges") for e in cell.extra)
    # The verdict line says what was skipped and that the risky cells all ran.
    total = len(report.cells) + len(report.skipped)
    assert summary(report).startswith(f"{len(report.cells)} of {total} cells run")
    assert "after outside deliveries all run" in summary(report)
    # Sampled without the trace, this workflow passed: the failing cell is not a sampled one.
    assert all(c.occurrence != 1 for c in risky_failed if c.point == "checkpoint.before_write")


@pytest.mark.slow
@pytest.mark.postgres
def test_a_direct_post_fails_the_cell_after_it_on_postgres() -> None:
    report = _chaos(
        "pay-direct", "postgres", points=("checkpoint.before_write",), max_occurrences=1
    )
    [cell] = [c for c in report.cells if c.verdict == "fail"]
    assert cell.after_deliveries and cell.node == "pay"
    assert "outside `@keel.effect`" in cell.cause


@pytest.mark.slow
def test_without_the_fork_server_plain_subprocesses_find_the_same_cell() -> None:
    report = _chaos(
        "pay-direct", points=("checkpoint.before_write",), max_occurrences=1, fork=False, jobs=1
    )
    [cell] = [c for c in report.cells if c.verdict == "fail"]
    assert cell.after_deliveries and cell.node == "pay"
