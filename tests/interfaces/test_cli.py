"""The `keel` command, on both backends.

The submit/worker/approve round trip runs the real `python -m keel` in subprocesses (two of
them approving at the same moment); the rest uses typer's CliRunner in this process. The
workflow under test (tests/support/apps/cli.py) sends its email to a real SMTP sink, so "sent once"
is counted by what the sink received.
"""

from __future__ import annotations

import gc
import getpass
import io
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import typer
import typer.core
import typer.main
from rich.console import Console
from typer.testing import CliRunner, Result

from keel.cli import render
from keel.cli.commands import cli
from keel.core.store.base import load_migrations
from keel.runtime.upkeep import PYTHON_GEN0, WORKER_GEN0
from keel.testing.postgres import drop_database
from keel.testing.smtp import SmtpSink
from tests.support.apps import versions
from tests.support.apps.cli import SUBJECT, WORKFLOW
from tests.support.workers import drain

REPO = Path(__file__).resolve().parents[2]
APP = "tests.support.apps.cli:app"  # bound to $KEEL_DATABASE_URL when a subprocess imports it
FRESH = "tests.support.apps.cli:fresh_app"
VERSIONS_APP = "tests.support.apps.versions:fresh_app"  # a new App per use, for in-process runs
TICKET = {"to": "customer@example.com", "body": "Fixed in 2.3.1.", "log": []}


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> dict[str, str]:
    """The environment of the commands: this test's database and artifacts, nothing inherited."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    base.update(
        KEEL_DATABASE_URL=db_url,
        KEEL_ARTIFACTS_DIR=str(tmp_path / "artifacts"),
        COLUMNS="200",
        NO_COLOR="1",
    )
    return base


@pytest.fixture
def fresh_url(backend: str, db_url: str, tmp_path: Path) -> Iterator[str]:
    """A database Keel has never migrated: a path with no file yet, or an empty PG database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/fresh/keel.db"
        return
    name = f"keel_cli_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{db_url.rpartition('/')[0]}/{name}"
    drop_database(db_url, name)


def invoke(env: dict[str, str], *args: str) -> Result:
    """Run the CLI in this process with the test's KEEL_* variables (and no others)."""
    overrides: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}
    overrides.update({k: v for k, v in env.items() if k.startswith("KEEL_") or k == "COLUMNS"})
    result = CliRunner().invoke(cli, list(args), env=overrides)
    # A bug, not a handled error: show it instead of asserting on a half-run command.
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def keel(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def keel_bg(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keel", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_error_line(stderr: str) -> str:
    """Handled errors are exactly one line, without a traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    return lines[0]


def show(env: dict[str, str], db_url: str, run_id: str) -> dict[str, Any]:
    result = invoke(env, "runs", "show", run_id, "--json", "--db", db_url)
    assert result.exit_code == 0, result.output
    details: dict[str, Any] = json.loads(result.stdout)
    return details


def submitted_run_id(stdout: str) -> str:
    found = re.search(r"admitted run (\S+) ", stdout)
    assert found, stdout
    return found[1]


# -- migrate ----------------------------------------------------------------------------------


def test_migrate_applies_then_says_already_at_version(
    backend: str, fresh_url: str, env: dict[str, str]
) -> None:
    migrations = load_migrations(backend)
    latest = migrations[-1].version
    first = invoke(env, "migrate", "--db", fresh_url)
    assert first.exit_code == 0, first.output
    for migration in migrations:
        assert migration.name in first.stdout
    assert f"now at version {latest}" in first.stdout
    assert "keel:keel@" not in first.stdout  # the password is not printed

    again = invoke(env, "migrate", "--db", fresh_url)
    assert again.exit_code == 0, again.output
    assert f"already at version {latest}" in again.stdout
    assert "applied" not in again.stdout

    listed = invoke(env, "runs", "list", "--json", "--db", fresh_url)
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == []


def test_migrate_defaults_to_the_app_default_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke({"KEEL_ARTIFACTS_DIR": str(tmp_path / "a")}, "migrate")
    assert result.exit_code == 0, result.output
    assert ".keel/keel.db" in result.stdout
    assert (tmp_path / ".keel" / "keel.db").is_file()


# -- the round trip, in real processes --------------------------------------------------------


def test_submit_worker_approve_round_trip(env: dict[str, str], db_url: str) -> None:
    payload = json.dumps(TICKET)
    with SmtpSink() as sink:
        env["KEEL_TEST_SMTP"] = f"{sink.host}:{sink.port}"
        submit = ("submit", APP, WORKFLOW, "--job-id", "ticket-4711", "--input", payload)
        first = keel(env, *submit)
        assert first.returncode == 0, first.stderr
        run_id = submitted_run_id(first.stdout)
        assert run_id.startswith("ticket-4711-")
        second = invoke(env, "submit", FRESH, *submit[2:])
        assert second.exit_code == 0, second.output
        assert "already admitted" in second.stdout
        assert f"run {run_id} " in second.stdout

        worker = keel(env, "worker", APP, "--stop-when-idle", "--concurrency", "2")
        assert worker.returncode == 0, worker.stderr
        # The run went to its approval: not "finished".
        assert "claimed 1: finished 0, waiting 1" in worker.stdout

        # What `keel approve RUN` needs, and what the approver decides on.
        pending = invoke(env, "approvals", "list", "--db", db_url)
        assert pending.exit_code == 0, pending.output
        assert run_id in pending.stdout and TICKET["to"] in pending.stdout

        text = invoke(env, "runs", "show", run_id, "--db", db_url)
        assert text.exit_code == 0, text.output
        for expected in (run_id, "waiting", "wait.registered", "manager", "approval", "pending"):
            assert expected in text.stdout
        details = show(env, db_url, run_id)
        assert details["run"]["status"] == "waiting"
        [wait] = details["waits"]
        assert (wait["kind"], wait["name"], wait["status"]) == ("approval", "manager", "pending")
        assert wait["payload"] == {"to": TICKET["to"]}
        assert details["effects"] == []
        assert sink.count() == 0
        listed = invoke(env, "approvals", "list", "--json", "--db", db_url)
        assert listed.exit_code == 0, listed.output
        [open_wait] = json.loads(listed.stdout)
        assert (open_wait["run_id"], open_wait["payload"]) == (run_id, {"to": TICKET["to"]})
        assert "manager" in invoke(env, "approvals", "list", "--db", db_url).stdout

        # Two people approve at the same moment from two processes: one decision is recorded.
        racers = {who: keel_bg(env, "approve", run_id, "--by", who) for who in ("alice", "bob")}
        outputs = {who: proc.communicate(timeout=90) for who, proc in racers.items()}
        for who, proc in racers.items():
            assert proc.returncode == 0, outputs[who]
        winners = [who for who, (out, _) in outputs.items() if out.startswith("recorded:")]
        assert len(winners) == 1, outputs
        [winner] = winners
        [loser] = set(racers) - {winner}
        assert f"already decided by {winner}" in outputs[loser][0]

        again = invoke(env, "approve", run_id, "--by", "carol", "--db", db_url)
        assert again.exit_code == 0, again.output
        assert f"already decided by {winner}" in again.stdout
        assert "changed nothing" in again.stdout
        contrary = invoke(env, "reject", run_id, "--by", "carol", "--db", db_url)
        assert contrary.exit_code == 1
        assert f"already decided by {winner}" in one_error_line(contrary.stderr)

        worker = keel(env, "worker", APP, "--stop-when-idle")
        assert worker.returncode == 0, worker.stderr

        listed = invoke(env, "runs", "list", "--json", "--db", db_url)
        assert listed.exit_code == 0, listed.output
        [row] = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id]
        assert (row["status"], row["decision"], row["termination_reason"]) == (
            "completed",
            "approved",
            "approved",
        )
        assert row["output"]["log"] == ["approved", "sent"]
        assert sink.count(subject=SUBJECT) == 1

        final = show(env, db_url, run_id)
        assert [(e["name"], e["status"]) for e in final["effects"]] == [("send_email", "sent")]
        assert final["waits"][0]["decided_by"] == winner
        # --by is what was typed; the login that ran the command is recorded beside it.
        assert final["waits"][0]["value"]["principal"] == f"login:{getpass.getuser()}"
        body = TICKET["body"].encode()
        assert [(a["name"], a["size"]) for a in final["artifacts"]] == [("reply.txt", len(body))]
        text = invoke(env, "runs", "show", run_id, "--db", db_url)
        for expected in ("completed", "reply.txt", "send_email", "effect.sent", winner):
            assert expected in text.stdout
        table = invoke(env, "runs", "list", "--status", "completed", "--db", db_url)
        assert run_id in table.stdout
        assert "cli-ticket@1" in table.stdout

        assert "no open waits" in invoke(env, "approvals", "list", "--db", db_url).stdout
        assert json.loads(invoke(env, "approvals", "list", "--json", "--db", db_url).stdout) == []
        # Both workers stopped when idle: none is live.
        assert json.loads(invoke(env, "workers", "--json", "--db", db_url).stdout) == []
        assert "no live workers" in invoke(env, "workers", "--db", db_url).stdout

        late = invoke(env, "approve", run_id, "--by", "dave", "--db", db_url)
        assert late.exit_code == 1
        line = one_error_line(late.stderr)
        assert "completed" in line
        assert "no more decisions" in line


def bring_to_in_doubt(env: dict[str, str], db_url: str, sink: SmtpSink, job: str) -> str:
    """A run whose email left while its worker died before the ledger recorded it."""
    env["KEEL_LEASE_TTL"] = "1"  # the killed worker's lease must expire quickly
    # Nobody settles an effect before its deadline: a short one, so the pending email is
    # judged in doubt in seconds, not after the default minute.
    env["KEEL_EFFECT_TIMEOUT"] = "2"
    env["KEEL_TEST_SMTP"] = f"{sink.host}:{sink.port}"
    created = invoke(
        env, "submit", FRESH, WORKFLOW, "--job-id", job, "--input", json.dumps(TICKET), "--json"
    )
    assert created.exit_code == 0, created.output
    admitted = json.loads(created.stdout)
    assert admitted["created"] is True
    run_id: str = admitted["run_id"]
    assert keel(env, "worker", APP, "--stop-when-idle").returncode == 0
    assert invoke(env, "approve", run_id, "--by", "alice", "--db", db_url).exit_code == 0

    crash_env = {**env, "KEEL_FAULTS": "effect.after_perform:send_email"}
    crashed = keel(crash_env, "worker", APP, "--stop-when-idle")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert sink.count(subject=SUBJECT) == 1

    assert keel(env, "worker", APP, "--stop-when-idle").returncode == 0
    paused = show(env, db_url, run_id)
    assert paused["run"]["status"] == "waiting"
    assert [e["status"] for e in paused["effects"]] == ["in_doubt"]
    pending = [w for w in paused["waits"] if w["status"] == "pending"]
    assert [w["kind"] for w in pending] == ["effect"]
    return run_id


@pytest.mark.slow
def test_in_doubt_effect_is_settled_from_the_cli(env: dict[str, str], db_url: str) -> None:
    with SmtpSink() as sink:
        run_id = bring_to_in_doubt(env, db_url, sink, "ticket-9")

        # An approval is not an answer to "did the email go out?".
        wrong = invoke(env, "approve", run_id, "--db", db_url)
        assert wrong.exit_code == 2
        assert "resolve-effect" in one_error_line(wrong.stderr)

        settled = invoke(
            env, "resolve-effect", run_id, "--performed", "--by", "ops", "--db", db_url
        )
        assert settled.exit_code == 0, settled.output
        assert settled.stdout.startswith("recorded: performed by ops")
        again = invoke(env, "resolve-effect", run_id, "--performed", "--db", db_url)
        assert again.exit_code == 0, again.output
        assert "already decided by ops" in again.stdout

        assert keel(env, "worker", APP, "--stop-when-idle").returncode == 0
        final = show(env, db_url, run_id)
        assert final["run"]["status"] == "completed"
        assert [e["status"] for e in final["effects"]] == ["confirmed"]
        assert sink.count(subject=SUBJECT) == 1  # settled, never sent twice


# -- errors -----------------------------------------------------------------------------------


def test_errors_are_one_red_line_with_an_exit_code(
    env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    unknown = invoke(env, "runs", "show", "ticket-1-0123456789abcdef", "--db", db_url)
    assert unknown.exit_code == 1
    assert "no run 'ticket-1-0123456789abcdef'" in one_error_line(unknown.stderr)
    assert invoke(env, "approve", "ticket-1-0123456789abcdef", "--db", db_url).exit_code == 1

    for command in (("runs", "show"), ("approve",), ("reject",)):
        malformed = invoke(env, *command, "../../etc", "--db", db_url)
        assert malformed.exit_code == 2, (command, malformed.output)
        assert "run_id '../../etc'" in one_error_line(malformed.stderr)

    submit = ("submit", FRESH, WORKFLOW, "--job-id", "ticket-1")
    bad_json = invoke(env, *submit, "--input", '{"to": "a@example.com",')
    assert bad_json.exit_code == 2
    assert "--input is not valid JSON" in one_error_line(bad_json.stderr)
    assert invoke(env, *submit).exit_code == 2  # no input at all
    assert invoke(env, *submit, "--input", "{}", "--input-file", "x.json").exit_code == 2

    not_an_object = invoke(env, *submit, "--input", "[1, 2]")
    assert not_an_object.exit_code == 2
    assert "input: expected an object" in one_error_line(not_an_object.stderr)

    unknown_workflow = invoke(
        env, "submit", FRESH, "no-such-flow", "--job-id", "t-1", "--input", "{}"
    )
    assert unknown_workflow.exit_code == 2
    assert "no workflow 'no-such-flow'" in one_error_line(unknown_workflow.stderr)
    bad_job = invoke(env, "submit", FRESH, WORKFLOW, "--job-id", "../x", "--input", "{}")
    assert bad_job.exit_code == 2
    assert "job_id" in one_error_line(bad_job.stderr)

    # A settled in-doubt effect or intent: --result is JSON, and only with --performed.
    run = "ticket-1-0123456789abcdef"
    for command in (("resolve-effect", run), ("effects", "resolve", "intent-0123456789abcdef")):
        unsent = invoke(env, *command, "--not-performed", "--result", "{}", "--db", db_url)
        assert unsent.exit_code == 2, (command, unsent.output)
        assert "--result only goes with --performed" in one_error_line(unsent.stderr)
        garbled = invoke(env, *command, "--performed", "--result", "{'ok'", "--db", db_url)
        assert garbled.exit_code == 2, (command, garbled.output)
        assert "--result is not valid JSON" in one_error_line(garbled.stderr)

    big = tmp_path / "big.json"
    big.write_text(json.dumps({**TICKET, "body": "x" * 1_100_000}))
    too_large = invoke(env, *submit, "--input-file", str(big))
    assert too_large.exit_code == 2
    assert "the limit is" in one_error_line(too_large.stderr)

    assert invoke(env, "runs", "list", "--status", "sleeping", "--db", db_url).exit_code == 2
    typo = invoke(env, "runs", "list", "--db", "postgresq://keel:s3cret@127.0.0.1:1/keel")
    assert typo.exit_code == 2
    assert "unsupported database URL 'postgresq://keel:***@" in one_error_line(typo.stderr)
    assert "s3cret" not in typo.output
    # submit takes its database from APP: no --db/--app to suggest.
    missing = dict(env, KEEL_DATABASE_URL=f"sqlite:///{tmp_path}/none/keel.db")
    nowhere = invoke(missing, *submit, "--input", json.dumps(TICKET))
    assert nowhere.exit_code == 1
    line = one_error_line(nowhere.stderr)
    assert "--db" not in line and "$KEEL_DATABASE_URL" in line
    unreachable = invoke(env, "runs", "list", "--db", "postgresql://keel:s3cret@127.0.0.1:1/keel")
    assert unreachable.exit_code == 1
    line = one_error_line(unreachable.stderr)
    assert "cannot connect to postgresql://keel:***@127.0.0.1:1/keel" in line
    assert "s3cret" not in unreachable.output
    assert json.loads(invoke(env, "runs", "list", "--json", "--db", db_url).stdout) == []


def test_odd_numbers_times_and_urls_are_one_line_with_exit_2(
    env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    """Each was a traceback, or silently did something else (a `nan` filter listed every
    run; a URL's `?mode=ro` made a new database named after it)."""
    cases: list[tuple[tuple[str, ...], str]] = [
        (("runs", "list", "--limit", "99999999999999999999", "--db", db_url), "out of range"),
        (("runs", "list", "--since", "nan", "--db", db_url), "is not a moment"),
        (("runs", "list", "--until", "1e400", "--db", db_url), "is not a moment"),
        (("prune", "--older-than", "9" * 30 + "d", "--dry-run", "--db", db_url), "a century"),
        (("runs", "list", "--db", f"sqlite:///{tmp_path}/k.db?mode=ro"), "takes no query"),
        (("runs", "list", "--db", "sqlite:///"), "needs a file path"),
        (("threads", "create", WORKFLOW, "--app", FRESH, "--metadata", '{"a": NaN}'), "NaN"),
    ]
    for args, said in cases:
        result = invoke(env, *args)
        assert result.exit_code == 2, (args, result.output)
        assert said in one_error_line(result.stderr), args
    assert not (tmp_path / "k.db?mode=ro").exists()
    ttl = invoke({**env, "KEEL_LEASE_TTL": "-5"}, "runs", "list", "--db", db_url)
    assert ttl.exit_code == 2 and "lease_ttl" in one_error_line(ttl.stderr)


def test_submit_tells_of_other_input_for_the_job_and_if_exists_refuses_it(
    env: dict[str, str],
) -> None:
    submit = ("submit", FRESH, WORKFLOW, "--job-id", "ticket-9")
    first = invoke(env, *submit, "--input", json.dumps(TICKET))
    assert first.exit_code == 0, first.output
    run_id = submitted_run_id(first.stdout)
    other = json.dumps({**TICKET, "body": "Another answer."})
    refused = invoke(env, *submit, "--input", other, "--if-exists", "error")
    assert refused.exit_code == 1
    line = one_error_line(refused.stderr)
    assert f"already has a run with other input ({run_id})" in line
    # In the CLI's own words, not Python's.
    assert "--if-exists new" in line and "if_exists=" not in line, line
    reused = invoke(env, *submit, "--input", other, "--if-exists", "reuse")
    assert reused.exit_code == 0 and f"reused run {run_id}" in reused.stdout
    # The job id is an idempotency key by default: a retry with other input gets that run.
    retried = invoke(env, *submit, "--input", other)
    assert retried.exit_code == 0 and f"reused run {run_id}" in retried.stdout
    admitted = invoke(env, *submit, "--input", other, "--if-exists", "new")
    assert admitted.exit_code == 0, admitted.output
    assert f"note: job ticket-9 already had 1 run(s) with other input (latest {run_id})" in (
        admitted.stdout
    )


def test_a_stranded_run_is_shown_and_upgraded_from_the_cli(env: dict[str, str], make_app) -> None:
    old = versions.register_v1(make_app())
    run_id = old.submit(versions.WORKFLOW, job_id="o-1", input={"order": "o-1"})["run_id"]
    drain(old)
    new = versions.register_new(make_app())
    drain(new)  # the new deployment's worker: it serves 2 and 3, not 1
    listed = invoke(env, "runs", "list")
    assert re.search(r"order@1\W+waiting \(stranded\)", listed.stdout), listed.stdout
    assert "waiting (stranded)" in invoke(env, "runs", "show", run_id).stdout
    assert json.loads(invoke(env, "runs", "show", run_id, "--json").stdout)["run"]["stranded"]
    upgrade = ("runs", "upgrade", run_id, "--app", VERSIONS_APP)
    no_app = invoke(env, "runs", "upgrade", run_id, "--to", "2")
    assert no_app.exit_code == 2 and "needs --app" in one_error_line(no_app.stderr)
    misfit = invoke(env, *upgrade, "--to", "3")
    assert misfit.exit_code == 1
    assert "node 'review' is not in that version" in one_error_line(misfit.stderr)
    moved = invoke(env, *upgrade, "--to", "2", "--by", "ops")
    assert moved.exit_code == 0, moved.output
    assert f"run {run_id} moved to order@2; waiting" in moved.stdout
    assert "stranded" not in invoke(env, "runs", "list").stdout
    new.approve(run_id, by="manager")
    drain(new)
    assert new.get_run(run_id).output["shipped_by"] == "v2"


def test_a_version_held_to_its_graph_is_accepted_from_the_cli(env: dict[str, str]) -> None:
    accept = ("versions", "accept", "--app", VERSIONS_APP, "--by", "ops")
    first = invoke(env, *accept, "order@3")
    assert first.exit_code == 0, first.output
    assert "order@3 is held to its graph as registered now (first served)" in first.stdout
    again = invoke(env, *accept, "order@3")
    assert "order@3: its graph is already the one it is held to; nothing changed" in again.stdout
    for bad, said in (("order", "expected NAME@VERSION"), ("order@9", "no workflow 'order@9'")):
        refused = invoke(env, *accept, bad)
        assert refused.exit_code in (1, 2) and said in one_error_line(refused.stderr), bad


def test_a_never_migrated_database_asks_for_keel_migrate(
    backend: str, fresh_url: str, env: dict[str, str], tmp_path: Path
) -> None:
    for command in (("runs", "show", "ticket-1-0123456789abcdef"), ("runs", "list")):
        result = invoke(env, *command, "--db", fresh_url)
        assert result.exit_code == 1, result.output
        assert "run `keel migrate`" in one_error_line(result.stderr)
    if backend == "sqlite":
        # Reading did not create the file; an empty file gets the same advice.
        path = Path(fresh_url.removeprefix("sqlite:///"))
        assert not path.exists()
        path.parent.mkdir(parents=True)
        sqlite3.connect(path).close()
        empty = invoke(env, "runs", "show", "ticket-1-0123456789abcdef", "--db", fresh_url)
        assert empty.exit_code == 1
        assert "run `keel migrate`" in one_error_line(empty.stderr)


def test_app_and_db_choose_the_database(env: dict[str, str], db_url: str, tmp_path: Path) -> None:
    created = invoke(env, "submit", FRESH, WORKFLOW, "--job-id", "t-2", "--input", "{}")
    assert created.exit_code == 0, created.output
    run_id = submitted_run_id(created.stdout)
    # --app reaches the App's database (here the same as $KEEL_DATABASE_URL).
    by_app = invoke(env, "runs", "list", "--json", "--app", FRESH)
    assert [r["run_id"] for r in json.loads(by_app.stdout)] == [run_id]
    other = f"sqlite:///{tmp_path}/other.db"
    conflict = invoke(env, "runs", "list", "--app", FRESH, "--db", other)
    assert conflict.exit_code == 2
    assert "pass one of them" in one_error_line(conflict.stderr)
    # A --db typed now outranks a KEEL_APP left in the environment.
    assert invoke(env, "migrate", "--db", other).exit_code == 0
    with_env_app = invoke({**env, "KEEL_APP": FRESH}, "runs", "list", "--json", "--db", other)
    assert with_env_app.exit_code == 0, with_env_app.output
    assert json.loads(with_env_app.stdout) == []


def test_every_command_explains_itself_and_is_documented() -> None:
    group = typer.main.get_command(cli)
    assert isinstance(group, typer.core.TyperGroup)
    runs = group.commands["runs"]
    assert isinstance(runs, typer.core.TyperGroup)
    approvals = group.commands["approvals"]
    assert isinstance(approvals, typer.core.TyperGroup)
    effects = group.commands["effects"]
    assert isinstance(effects, typer.core.TyperGroup)
    threads = group.commands["threads"]
    assert isinstance(threads, typer.core.TyperGroup)
    schedules = group.commands["schedules"]
    assert isinstance(schedules, typer.core.TyperGroup)
    versions = group.commands["versions"]
    assert isinstance(versions, typer.core.TyperGroup)
    groups = ("runs", "approvals", "effects", "threads", "schedules", "versions")
    names = [(n,) for n in group.commands if n not in groups]
    names += [("runs", n) for n in runs.commands] + [("approvals", n) for n in approvals.commands]
    names += [("effects", n) for n in effects.commands] + [("threads", n) for n in threads.commands]
    names += [("schedules", n) for n in schedules.commands]
    names += [("versions", n) for n in versions.commands]
    expected = {"migrate", "demo", "dev", "worker", "serve", "submit", "approve", "reject"}
    expected |= {"resolve-effect", "cancel", "workers", "chaos", "prune", "dispatcher", "audit"}
    assert {n[0] for n in names if len(n) == 1} == expected
    runs_commands = {"list", "show", "cancel", "resume", "upgrade", "watch", "replay"}
    assert {n[1] for n in names if n[0] == "runs" and len(n) == 2} == runs_commands
    assert {n[1] for n in names if n[0] == "approvals"} == {"list"}
    assert {n[1] for n in names if n[0] == "effects"} == {"list", "retry", "resolve"}
    assert {n[1] for n in names if n[0] == "versions"} == {"accept"}
    schedule_commands = {"list", "show", "create", "pause", "resume", "delete", "trigger"}
    assert {n[1] for n in names if n[0] == "schedules"} == schedule_commands
    headings = [h for h in (REPO / "docs" / "cli.md").read_text().splitlines() if h[:3] == "## "]
    for name in names:
        result = invoke({}, *name, "--help")
        assert result.exit_code == 0, (name, result.output)
        parents = {"runs": runs, "approvals": approvals, "effects": effects, "threads": threads}
        parent = {**parents, "schedules": schedules, "versions": versions}.get(name[0])
        command = parent.commands[name[1]] if parent and len(name) == 2 else group.commands[name[0]]
        summary = (command.help or "").split(".")[0].split()
        assert len(summary) >= 3, name
        assert " ".join(summary[:3]) in " ".join(result.output.split()), (name, result.output)
        documented = [h for h in headings if f"`keel {' '.join(name)}" in h]
        assert documented, f"docs/cli.md has no section on keel {' '.join(name)}"


def test_times_sizes_and_urls_read_well() -> None:
    now = 1_800_001_033.0  # minute 17 in UTC: far from local midnight in every time zone
    local = time.localtime
    assert render.ago(5.4) == "5s ago"
    assert render.ago(3599) == "59m ago"
    assert render.ago(-7200) == "in 2h"
    assert render.ago(3 * 86400) == "3d ago"
    assert render.when(None) == "-"
    assert render.when(now - 90, now).endswith("(1m ago)")
    assert render.when(now, now).startswith(time.strftime("%Y-%m-%d %H:%M:%S", local(now)))
    assert render.short_when(now - 30, now) == time.strftime("%H:%M:%S (30s ago)", local(now - 30))
    sizes = [render.size(n) for n in (512, 2048, 5 * 1024**2)]
    assert sizes == ["512 B", "2.0 KiB", "5.0 MiB"]
    secret = "postgresql://keel:s3cret@db:5432/keel"
    assert render.redact(secret) == "postgresql://keel:***@db:5432/keel"
    assert render.redact("sqlite:///.keel/keel.db") == "sqlite:///.keel/keel.db"
    assert render.decoded({"input": '{"a": 1}', "error": "{not json"}) == {
        "input": {"a": 1},
        "error": "{not json",
    }


def test_the_workers_table_tells_a_silent_worker_from_a_dead_one() -> None:
    now = 1_800_000_000.0
    worker = {"host": "h", "pid": 7, "concurrency": 4, "workflows": '["w@1"]'}
    rows = [
        {**worker, "worker_id": f"w-{state}", "state": state, "started_at": now - 7200}
        | {"heartbeat_at": now - quiet}
        for state, quiet in (("live", 1), ("silent", 40), ("dead", 1800))
    ]
    console = Console(width=400, record=True, file=io.StringIO())
    console.print(render.workers_table(rows, now))
    lines = console.export_text().splitlines()
    line = {s: next(x for x in lines if f"w-{s} " in x) for s in ("live", "silent", "dead")}
    assert line["live"].rstrip(" │").endswith("live")
    assert "silent: waiting for its database, or dead" in line["silent"]
    assert "dead: silent for over three lease TTLs, its leases lapsed" in line["dead"]
    assert "waiting for its database" not in line["dead"]


def test_serve_answers_until_sigterm(env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = keel_bg(env, "serve", APP, "--port", str(port), "--log-level", "warning")
    try:
        ready: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while not ready and time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    ready = json.loads(r.read())
            except OSError:
                time.sleep(0.1)
        assert ready.get("status") == "ready", (ready, server.poll())
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
    assert server.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err
    # No $KEEL_API_TOKENS in this environment: said before the first 401, not after, once.
    assert "no API tokens: $KEEL_API_TOKENS is empty" in err
    assert err.count("no API tokens") == 1, err


# -- failures that must not loop: resume, broken graphs -----------------------------------------


def test_runs_resume_continues_a_failed_run_without_sending_again(
    env: dict[str, str], db_url: str, tmp_path: Path
) -> None:
    broken = tmp_path / "printer-broken"
    broken.touch()
    shop = "tests.support.apps.shipping:app"
    with SmtpSink() as sink:
        env = {**env, "KEEL_TEST_SMTP": f"127.0.0.1:{sink.port}", "SHIPPING_BROKEN": str(broken)}
        submitted = keel(
            env, "submit", shop, "shipping", "--job-id", "o-1", "--input", '{"order": "o-1"}'
        )
        assert submitted.returncode == 0, submitted.stderr
        run_id = submitted_run_id(submitted.stdout)
        assert keel(env, "worker", shop, "--stop-when-idle").returncode == 0
        assert show(env, db_url, run_id)["run"]["status"] == "failed"
        assert sink.count() == 1

        broken.unlink()  # fixed; now resume rather than rerun
        resumed = keel(env, "runs", "resume", run_id, "--by", "ops")
        assert resumed.returncode == 0, resumed.stderr
        assert f"resumed run {run_id}" in resumed.stdout
        again = keel(env, "runs", "resume", run_id)
        assert again.returncode == 1
        assert "only a failed run can be resumed" in one_error_line(again.stderr)
        assert keel(env, "worker", shop, "--stop-when-idle").returncode == 0
        final = show(env, db_url, run_id)
        assert final["run"]["status"] == "completed"
        assert final["run"]["output"] is not None
        assert sink.count() == 1  # the confirmation went out once, before the failure
        assert [e["status"] for e in final["effects"]] == ["sent"]


def test_a_graph_that_cannot_compile_is_refused_at_submit_and_worker_start(
    env: dict[str, str],
) -> None:
    broken = "tests.support.apps.broken:app"
    submitted = keel(env, "submit", broken, "no-start", "--job-id", "j", "--input", "{}")
    assert submitted.returncode == 1
    line = one_error_line(submitted.stderr)
    assert "workflow no-start@1: its graph does not compile" in line
    worker = keel(env, "worker", broken, "--stop-when-idle")
    assert worker.returncode == 1
    assert "does not compile" in one_error_line(worker.stderr)


def test_the_worker_command_collects_less_often_than_python(env: dict[str, str]) -> None:
    before = gc.get_threshold()
    gc.set_threshold(PYTHON_GEN0, *before[1:])
    try:
        result = invoke(env, "worker", FRESH, "--stop-when-idle")
        assert result.exit_code == 0, result.output
        assert gc.get_threshold() == (WORKER_GEN0, *before[1:])
    finally:
        gc.set_threshold(*before)
