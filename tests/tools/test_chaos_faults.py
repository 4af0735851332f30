"""`keel chaos --fault`: each fault kind driven on a small graph (the mailer: prepare -> approval
-> one reconciled email), with what the outside world received counted by the harness's sinks.

Each of these cells failed before the runtime fix it covers landed (db-error and db-restart
before faults-infra: a database error inside a run failed it; clock-skew before faults-clock:
lease expiry was judged by the worker's clock), so a pass here means the fix holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest
import typer

from keel.chaos.command import chaos as chaos_command
from keel.chaos.harness import ChaosConfig, Report
from keel.chaos.matrix import run_matrix
from keel.chaos.report import as_json, write_junit
from keel.cli.commands import cli
from keel.testing import pgcluster

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "postgresql://keel:keel@127.0.0.1:5432/keel")


def mailer_matrix(tmp_path: Path, faults: tuple[str, ...], **options: Any) -> Report:
    options.setdefault("points", ("effect.after_perform",))
    config = ChaosConfig(
        app="tests.support.apps.mailer:app",
        workflow="mailer",
        input={"ticket": "7", "to": "ana@example.com"},
        env={"MAILER_SMTP_URL": "{smtp_url}", "MAILER_SPOOL": "{smtp_spool}"},
        max_occurrences=1,
        faults=faults,
        cwd=ROOT,
        workdir=tmp_path / "chaos",
        cell_timeout=60,
        **options,
    )
    return run_matrix(config)


def verdicts(report: Report) -> dict[str, list[str]]:
    return {c.name: c.problems for c in report.cells if c.verdict != "pass"}


@pytest.mark.slow
def test_a_frozen_worker_resumed_after_the_takeover_writes_nothing_and_sends_nothing(
    tmp_path: Path,
) -> None:
    # Frozen right after the provider accepted the email: another worker takes the run over
    # (a higher token), then the zombie continues and tries to record the effect as sent.
    report = mailer_matrix(tmp_path, ("freeze",))
    assert report.clean.world["smtp messages"] == 1
    [cell] = report.cells
    assert (cell.kind, cell.point, cell.phase) == ("freeze", "effect.after_perform", 1)
    # pass means: the timeline shows the takeover, no event under the zombie's token after it,
    # one email received, the run completed as the clean one did.
    assert cell.verdict == "pass", cell.problems
    # The report says which fault each cell is.
    assert as_json(report)["cells"][0]["kind"] == "freeze"
    assert as_json(report)["faults"] == ["freeze"]
    junit = tmp_path / "chaos.xml"
    write_junit(report, junit)
    [case] = ET.parse(junit).getroot().iter("testcase")
    assert case.get("name") == "phase 1 freeze effect.after_perform@1"
    assert case.get("classname") == "keel.chaos.mailer.freeze"
    zombie_said = "\n".join(p.read_text() for p in (tmp_path / "chaos" / "logs").glob("*.log"))
    # The zombie was fenced out, not merely idle: its record of the effect met the new token
    # (LeaseLost: "lease lost"), or its heartbeat, overdue when it woke, found the takeover
    # first ("was taken over") and stopped it; the verdict above says it wrote nothing.
    assert "lease lost" in zombie_said or "was taken over" in zombie_said, zombie_said


@pytest.mark.slow
def test_a_failed_statement_at_the_point_does_not_fail_the_run_on_sqlite(tmp_path: Path) -> None:
    report = mailer_matrix(tmp_path, ("db-error",))
    [cell] = report.cells
    assert cell.kind == "db-error"
    assert report.ok, verdicts(report)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_worker_frozen_inside_its_checkpoint_transaction_can_be_taken_over_on_postgres(
    tmp_path: Path, pg_template: str
) -> None:
    # Frozen holding the run's row lock (the fence of its checkpoint write): without the
    # server's idle-in-transaction timeout no other worker could claim the run while it slept.
    report = mailer_matrix(
        tmp_path,
        ("freeze",),
        backend="postgres",
        postgres_url=PG_URL,
        points=("checkpoint.before_write",),
    )
    assert {c.kind for c in report.cells} == {"freeze"}
    assert report.ok, verdicts(report)


@pytest.mark.slow
@pytest.mark.postgres
def test_terminated_backends_at_the_point_do_not_fail_the_run_on_postgres(
    tmp_path: Path, pg_template: str
) -> None:
    report = mailer_matrix(tmp_path, ("db-error",), backend="postgres", postgres_url=PG_URL)
    assert [c.kind for c in report.cells] == ["db-error"]
    assert report.ok, verdicts(report)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.skipif(pgcluster.available() is not None, reason=str(pgcluster.available()))
def test_a_database_restart_at_the_point_does_not_fail_the_run(
    tmp_path: Path, pg_template: str
) -> None:
    # Its own throwaway cluster: the shared server is never restarted.
    report = mailer_matrix(
        tmp_path,
        ("db-restart",),
        backend="postgres",
        postgres_url=PG_URL,
        points=("checkpoint.before_write",),
    )
    assert {c.kind for c in report.cells} == {"db-restart"}
    assert report.ok, verdicts(report)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_worker_whose_clock_is_ahead_does_not_take_a_live_lease(
    tmp_path: Path, pg_template: str
) -> None:
    # The second worker runs as on a host whose clock is 45 s ahead (lease TTL 15 s); leases
    # are judged by the database's clock, so it must not take the held worker's live lease.
    report = mailer_matrix(tmp_path, ("clock-skew",), backend="postgres", postgres_url=PG_URL)
    [cell] = report.cells
    assert cell.kind == "clock-skew"
    assert report.ok, verdicts(report)


def keel_chaos(*args: str) -> subprocess.CompletedProcess[str]:
    sample = ROOT / "keel" / "demo" / "support_ticket" / "sample-ticket.json"
    argv = [sys.executable, "-m", "keel", "chaos", "keel.demo.support_ticket:app"]
    argv += ["--workflow", "support-ticket", "--input", str(sample), *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def said(done: subprocess.CompletedProcess[str]) -> str:
    """The error, unwrapped from rich's box."""
    return " ".join(done.stderr.replace("│", " ").split())


def test_an_unknown_fault_kind_is_refused_before_any_cell() -> None:
    done = keel_chaos("--fault", "kill,flood")
    assert done.returncode == 2
    assert (
        "unknown fault kinds ['flood']; known: kill, freeze, db-restart, clock-skew, db-error"
        in (said(done))
    )


def test_a_database_restart_on_sqlite_is_refused() -> None:
    done = keel_chaos("--fault", "db-restart", "--backend", "sqlite")
    assert done.returncode == 2
    assert "--fault db-restart needs --backend postgres" in said(done)


def test_chaos_keeps_every_option_of_its_own_beside_the_log_options() -> None:
    # Each option as the harness declares it (names, help, default, required), checked on the
    # `keel chaos` command: a wrapper that hid them behind strings once turned `--input` into
    # a bare positional and dropped every help text.
    alone = typer.Typer(add_completion=False)
    alone.command()(chaos_command)
    wanted = {p.name: p for p in typer.main.get_command(alone).params}
    group = typer.main.get_command(cli)
    assert isinstance(group, typer.core.TyperGroup)
    command = group.commands["chaos"]
    got = {p.name: p for p in command.params}
    assert set(got) == set(wanted) | {"log_level", "log_format"}
    for name, param in wanted.items():
        mine = got[name]
        assert (mine.opts, mine.secondary_opts, type(mine)) == (
            param.opts,
            param.secondary_opts,
            type(param),
        ), name
        assert (mine.default, mine.required, mine.multiple) == (
            param.default,
            param.required,
            param.multiple,
        ), name
        assert getattr(mine, "help", None) == getattr(param, "help", None), name
    assert got["log_level"].opts == ["--log-level"] and got["log_format"].opts == ["--log-format"]


def test_chaos_logs_json_lines_with_log_format_json_and_refuses_a_bad_format(
    tmp_path: Path,
) -> None:
    done = keel_chaos(
        "--env",
        "SUPPORT_SMTP_URL={smtp_url}",
        "--env",
        "SUPPORT_MAIL_SPOOL={smtp_spool}",
        "--point",
        "run.before_first_checkpoint",
        "--max-occurrences",
        "1",
        "--json",
        str(tmp_path / "report.json"),
        "--junit",
        str(tmp_path / "report.xml"),
        "--log-level",
        "info",
        "--log-format",
        "json",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 0 failed" in done.stdout
    assert (tmp_path / "report.json").exists() and (tmp_path / "report.xml").exists()
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    docs = [json.loads(line) for line in lines]  # every line of the log is a JSON object
    admitted = [d for d in docs if d.get("event") == "admitted"]
    assert admitted and admitted[0]["logger"] == "keel.events" and admitted[0]["run_id"]
    bad = keel_chaos("--log-format", "yaml")
    assert bad.returncode == 2 and "log format 'yaml' is not one of text, json" in said(bad)


def chaos_on(spec: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    empty = tmp_path / "input.json"
    empty.write_text("{}")
    argv = [sys.executable, "-m", "keel", "chaos", spec, "--workflow", "echo"]
    argv += ["--input", str(empty), "--cell-timeout", "60"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=50)


def test_an_app_with_its_database_fixed_in_code_is_refused_in_one_line(tmp_path: Path) -> None:
    done = chaos_on("tests.support.apps.fixed_url:app", tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "fixes its database in code" in output and "keel.App()" in output
    assert "Traceback" not in output


def test_a_worker_that_gives_up_stops_the_harness_at_once_with_its_last_line(
    tmp_path: Path,
) -> None:
    # The cell timeout is 60 s and the test's own 50: only stopping at once passes.
    done = chaos_on("tests.support.apps.gives_up:app", tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "a worker exited with status 1 before the run ended" in output
    assert "no SMTP password in this environment: set MAIL_PASSWORD" in output
    assert "Traceback" not in output
