"""`keel audit APP`: each problem found where it is, once, with its fix; a clean app passes.

The apps are tests/support/apps/audit_targets.py; the command runs in this process (typer's
CliRunner), with no $KEEL_* variable inherited from the environment.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from keel.chaos.audit import CLIENTS
from keel.cli.commands import cli
from tests.support.apps import versions
from tests.support.workers import drain

TARGETS = "tests.support.apps.audit_targets"
FLAWED = "flawed@1"
WEAK = "hunter2hunter2"


def audit(env: dict[str, str], *args: str) -> Result:
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}
    return CliRunner().invoke(cli, ["audit", *args], env={**unset, "COLUMNS": "250", **env})


def findings(result: Result) -> list[dict[str, Any]]:
    document = json.loads(result.stdout)
    return list(document["findings"])


def where(found: list[dict[str, Any]]) -> Counter[tuple[str, str | None, str, str]]:
    return Counter((f["code"], f["workflow"], f["subject"], f["level"]) for f in found)


@pytest.fixture
def no_db(tmp_path: Path) -> dict[str, str]:
    """A database URL with nothing there: the checks that need one are skipped."""
    return {"KEEL_DATABASE_URL": f"sqlite:///{tmp_path}/none.db"}


def test_an_app_with_every_fix_applied_audits_clean(no_db: dict[str, str]) -> None:
    strong = secrets.token_urlsafe(32)
    env = {**no_db, "KEEL_API_TOKENS": f"{strong}=*"}
    result = audit(env, f"{TARGETS}:clean_app", "--strict")
    assert result.exit_code == 0, result.output
    assert "clean@1" not in result.stdout  # no finding, so no heading for it
    assert "no findings: 0 error(s), 0 warning(s), 0 info in 1 workflow(s)" in result.stdout
    assert "skipped version.graph-changed: no database file" in result.stdout
    assert not Path(no_db["KEEL_DATABASE_URL"].removeprefix("sqlite:///")).exists()
    document = json.loads(audit(env, f"{TARGETS}:clean_app", "--json").stdout)
    assert document["ok"] is True and document["findings"] == []
    assert document["workflows"] == ["clean@1"]


def test_each_problem_is_found_once_where_it_is_and_fails_the_audit(
    no_db: dict[str, str],
) -> None:
    strong = secrets.token_urlsafe(32)
    env = {**no_db, "KEEL_API_TOKENS": f"{WEAK}=*;{strong}=runs:read"}
    result = audit(env, f"{TARGETS}:flawed_app", "--json")
    assert result.exit_code == 1, result.output
    found = findings(result)
    expected = {
        ("version.unpinned", FLAWED, "flawed", "warning"),
        ("effect.reconcile-only", FLAWED, "refund", "warning"),
        ("effect.in-doubt-on-crash", FLAWED, "page", "info"),
        ("wait.approval-no-timeout", FLAWED, "ask", "warning"),
        ("wait.interrupt-no-deadline", FLAWED, "pause", "warning"),
        ("effect.outside-ledger", FLAWED, "post", "warning"),
        ("token.weak", None, "token 1 of 2 (*)", "error"),
        ("effect.no-timeout", FLAWED, "page", "warning"),
        ("lease.shorter-than-effect", FLAWED, "refund", "warning"),
    }
    assert where(found) == Counter(expected)
    for f in found:
        assert f["message"] and f["fix"] and "\n" not in f["message"] + f["fix"]
    smtp = next(f for f in found if f["code"] == "effect.outside-ledger")
    assert "smtplib" in smtp["message"] and "_post_status" in smtp["message"]
    assert WEAK not in result.stdout  # a token is never quoted
    document = json.loads(result.stdout)
    assert document["ok"] is False
    assert document["counts"]["error"] == len([f for f in found if f["level"] == "error"])
    assert [s["check"] for s in document["skipped"]] == ["version.graph-changed"]


def test_the_human_report_is_one_line_per_finding_with_its_fix(no_db: dict[str, str]) -> None:
    result = audit(no_db, f"{TARGETS}:flawed_app")
    assert result.exit_code == 0, result.output  # warnings only here: --strict fails on them
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"keel audit {TARGETS}:flawed_app (database sqlite:///")
    assert lines[1] == FLAWED
    body = [line for line in lines if line.startswith("  ")]
    assert body and all("; fix: " in line for line in body)
    assert any(line.startswith("  warning wait.interrupt-no-deadline [pause]: ") for line in body)
    assert "skipped token.weak: $KEEL_API_TOKENS is not set here" in result.stdout
    assert lines[-1].startswith(f"{len(body)} finding(s): ")


def test_strict_fails_on_warnings_and_a_bad_app_is_a_usage_error(no_db: dict[str, str]) -> None:
    # order@1 has one warning (its approval has no timeout) and no error.
    assert audit(no_db, f"{TARGETS}:drift_v1").exit_code == 0
    assert audit(no_db, f"{TARGETS}:drift_v1", "--strict").exit_code == 1
    assert audit(no_db, f"{TARGETS}:nothing_here").exit_code == 2
    assert audit(no_db, "tests.support.apps.no_such_module:app").exit_code == 2


def test_a_graph_changed_under_the_same_version_is_an_error_for_its_paused_runs(
    db_url: str, make_app: Any
) -> None:
    old = versions.register_v1(make_app())
    run_id = old.submit(versions.WORKFLOW, job_id="o-1", input={"order": "o-1"})["run_id"]
    drain(old)  # paused in `review`
    env = {"KEEL_DATABASE_URL": db_url}
    same = findings(audit(env, f"{TARGETS}:drift_v1", "--json"))
    assert not [f for f in same if f["code"] == "version.graph-changed"]
    result = audit(env, f"{TARGETS}:drift_changed", "--json")
    assert result.exit_code == 1, result.output
    changed = [f for f in findings(result) if f["code"] == "version.graph-changed"]
    assert [(f["level"], f["workflow"], f["subject"]) for f in changed] == [
        ("error", "order@1", run_id)
    ]
    assert "node 'review' is not in that version" in changed[0]["message"]
    assert json.loads(result.stdout)["skipped"][0]["check"] == "token.weak"


def test_the_shipped_examples_audit_without_errors(no_db: dict[str, str]) -> None:
    for spec in ("keel.demo.support_ticket:app", "examples.newsletter:app"):
        result = audit(no_db, spec, "--json")
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        assert document["counts"]["error"] == 0
        assert not [f for f in document["findings"] if f["code"] == "effect.outside-ledger"]


def test_the_clients_looked_for_include_the_usual_ones() -> None:
    assert {"smtplib", "requests", "httpx", "urllib.request", "socket", "stripe"} <= set(CLIENTS)
