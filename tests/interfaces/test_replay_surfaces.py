"""Replay from the outside: `keel runs replay RUN [--from STEP] [--json]` (a table or JSON, exit
code 3 on divergence, 2 for a step the run does not have) and `POST /v1/runs/{id}/replay`; the
provider (a real HTTP sink) sees nothing of either."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

import keel
from keel.cli import cli
from keel.service import create_app
from keel.testing.http import HttpSink
from tests.support.apps.replayed import WORKFLOW, graph
from tests.support.apps.service import LiveServer
from tests.support.service_client import READER, RUNS_WRITER, TOKENS, bearer
from tests.support.workers import drain

APP = "tests.support.apps.replayed:fresh_app"


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


def replay(db_url: str, sink: HttpSink, *args: str, change: str = "", app: str = APP) -> Result:
    env = {k: None for k in os.environ if k.startswith(("KEEL_", "REPLAY_"))}
    env.update(
        KEEL_DATABASE_URL=db_url, REPLAY_SINK_URL=sink.url, REPLAY_CHANGE=change, COLUMNS="200"
    )
    result = CliRunner().invoke(cli, ["runs", "replay", *args, "--app", app], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def charged(make_app: Callable[..., keel.App]) -> tuple[keel.App, str]:
    """A run of `charge` approved by a manager, that charged once ($REPLAY_SINK_URL)."""
    app = make_app()
    app.workflow(WORKFLOW)(graph)
    run = app.submit(WORKFLOW, job_id="o-9", input={"order": "o-9", "amount": 5, "log": []})
    drain(app)
    app.approve(run.run_id, by="manager")
    drain(app)
    return app, run.run_id


def test_runs_replay_reports_no_divergence_then_a_renamed_route(
    make_app: Callable[..., keel.App],
    db_url: str,
    sink: HttpSink,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REPLAY_SINK_URL", sink.url)
    _, run_id = charged(make_app)
    assert len(sink.requests) == 1

    same = replay(db_url, sink, run_id)
    assert same.exit_code == 0, same.output
    assert "no divergence" in same.stdout and "1 effect(s) served" in same.stdout

    renamed = replay(db_url, sink, run_id, change="rename")
    assert renamed.exit_code == 3, renamed.output
    assert "diverged at step 1 (node review)" in renamed.stdout
    assert "route" in renamed.stdout and '["charge"]' in renamed.stdout
    assert '["pay"]' in renamed.stdout

    as_json = replay(db_url, sink, run_id, "--json", "--from", "2", change="amount")
    assert as_json.exit_code == 3, as_json.output
    report = json.loads(as_json.stdout)
    assert (report["step"], report["from_step"]) == (2, 2)
    assert report["differences"][0]["what"] == "effect_arguments"

    missing = replay(db_url, sink, run_id, "--from", "9")
    assert missing.exit_code == 2
    assert "has no step 9" in missing.stderr
    # An app that does not register the run's workflow version cannot replay it: exit 2.
    other = replay(db_url, sink, run_id, app="tests.support.apps.cli:fresh_app")
    assert other.exit_code == 2 and "no workflow 'charge@1'" in other.stderr
    assert len(sink.requests) == 1, "a replay reached the provider"


def test_post_replay_returns_the_report_and_needs_the_write_scope(
    make_app: Callable[..., keel.App], sink: HttpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAY_SINK_URL", sink.url)
    app, run_id = charged(make_app)
    with LiveServer(create_app(app, tokens=TOKENS)) as server:
        url = f"{server.url}/v1/runs/{run_id}/replay"
        refused = httpx.post(url, headers=bearer(READER), timeout=30)
        assert refused.status_code == 403
        answer = httpx.post(url, headers=bearer(RUNS_WRITER), timeout=30)
        assert answer.status_code == 200, answer.text
        report = answer.json()
        assert (report["diverged"], report["effects_served"]) == (False, 1)
        from_two = httpx.post(url, params={"from": 2}, headers=bearer(RUNS_WRITER))
        assert (from_two.status_code, from_two.json()["from_step"]) == (200, 2)
        bad = httpx.post(url, params={"from": 9}, headers=bearer(RUNS_WRITER))
        assert bad.status_code == 400 and "has no step 9" in bad.text
        missing = httpx.post(f"{server.url}/v1/runs/nope-0000/replay", headers=bearer(RUNS_WRITER))
        assert missing.status_code == 404
        # A replay takes no options in its body: `{}` is none, anything else is a mistake
        # (it was ignored, a replay from step 0 answered as if the option had been heard).
        writer = {**bearer(RUNS_WRITER), "Content-Type": "application/json"}
        empty = httpx.post(url, content=b"{}", headers=writer, timeout=30)
        assert empty.status_code == 200, empty.text
        for body in [b"{nope", b"[1]", b'{"from": 2}']:
            wrong = httpx.post(url, content=body, headers=writer)
            assert (wrong.status_code, wrong.json()["error"]) == (422, "invalid_request"), body
    assert len(sink.requests) == 1
