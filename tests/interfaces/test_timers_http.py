"""Delayed runs through every surface (issue 33): Keel's HTTP API (`after`, `not_before`), its
thread runs, the Agent Server protocol's `after_seconds` (langgraph-sdk), and `keel submit
--after` / `keel threads submit --after`. Each is admitted at once, queued with a not-before
time on the database's clock, and refused clearly when the time is not one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import Result
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import APIStatusError, UnprocessableEntityError
from typer.testing import CliRunner

import keel
from keel.cli.commands import cli
from tests.support.service_client import ADMIN, Service
from tests.support.thread_graphs import chat

Serve = Callable[..., Service]
APP = "tests.support.thread_graphs:fresh_app"  # a new App on $KEEL_DATABASE_URL at each use


def _no_worker_takes_it_yet(app: keel.App, run_id: str) -> float:
    row = app.get_run(run_id).run
    assert row["status"] == "queued"
    assert row["not_before"] is not None
    return float(row["not_before"]) - float(row["created_at"])


def test_v1_submit_takes_after_and_not_before(svc: Service) -> None:
    base = {"workflow": "review", "input": {"topic": "ai"}}
    later = svc.http.post("/v1/runs", json={**base, "job_id": "j-after", "after": "5m"})
    assert later.status_code == 201, later.text
    assert later.json()["not_before"] == pytest.approx(later.json()["created_at"] + 300)
    assert _no_worker_takes_it_yet(svc.app, later.json()["run_id"]) == pytest.approx(300)
    when = datetime.now(UTC) + timedelta(hours=1)
    at = svc.http.post("/v1/runs", json={**base, "job_id": "j-at", "not_before": when.isoformat()})
    assert at.status_code == 201, at.text
    assert at.json()["not_before"] == pytest.approx(when.timestamp())
    for bad, word in [
        ({"after": -3}, "negative"),
        ({"after": "soon"}, "not a duration"),
        ({"after": 5, "not_before": when.isoformat()}, "not both"),
        ({"not_before": "2030-01-01T00:00:00"}, "timezone"),
        # Past a century, as `after` is: a run that would never start (it was admitted).
        ({"not_before": "9999-12-31T23:59:59+00:00"}, "century"),
        ({"not_before": 99999999999999}, "century"),
        ({"after": 10**12}, "century"),
    ]:
        refused = svc.http.post("/v1/runs", json={**base, "job_id": "j-bad", **bad})
        assert refused.status_code in (400, 422), refused.text
        assert word in refused.text
    assert len(svc.app.list_runs()) == 2, "a refused submission admits nothing"


def test_a_thread_run_takes_after(svc: Service) -> None:
    svc.app.workflow("chat")(chat)
    made = svc.http.post(
        "/v1/threads/t-later/runs",
        json={"workflow": "chat", "input": {"messages": [["user", "hi"]]}, "after": 90},
    )
    assert made.status_code == 201, made.text
    assert made.json()["thread_seq"] == 1
    assert _no_worker_takes_it_yet(svc.app, made.json()["run_id"]) == pytest.approx(90)


def test_the_agent_server_protocol_takes_after_seconds(svc: Service) -> None:
    svc.app.workflow("chat")(chat)
    client = get_sync_client(url=svc.url, api_key=ADMIN)
    thread = client.threads.create()["thread_id"]
    say = {"messages": [{"role": "user", "content": "hi"}]}
    run = client.runs.create(thread, "chat", input=say, after_seconds=120)
    assert run["status"] == "pending"
    assert _no_worker_takes_it_yet(svc.app, run["run_id"]) == pytest.approx(120)
    stateless = client.runs.create(None, "chat", input=say, after_seconds=30)
    assert _no_worker_takes_it_yet(svc.app, stateless["run_id"]) == pytest.approx(30)
    with pytest.raises(UnprocessableEntityError) as refused:
        client.runs.create(thread, "chat", input=say, after_seconds=-1)
    assert "after_seconds" in refused.value.body["message"]  # type: ignore[index]
    with pytest.raises(APIStatusError) as refused_long:
        client.runs.create(thread, "chat", input=say, after_seconds=1e12)
    assert refused_long.value.response.status_code in (400, 422)
    assert "century" in refused_long.value.response.text
    assert len(client.runs.list(thread)) == 1


def invoke(db_url: str, *args: str) -> Result:
    """The CLI in this process, on the test's database only."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}
    env["KEEL_DATABASE_URL"] = db_url
    return CliRunner().invoke(cli, list(args), env=env)


def test_cli_submit_and_threads_submit_take_after(db_url: str) -> None:
    turn = '{"messages": [["user", "hi"]]}'
    done = invoke(db_url, "submit", APP, "chat", "--job-id", "j-cli", "--input", turn,
                  "--after", "10m", "--json")  # fmt: skip
    assert done.exit_code == 0, done.output
    row = json.loads(done.stdout)
    assert row["created"] and row["status"] == "queued"
    assert row["not_before"] is not None
    said = invoke(db_url, "threads", "submit", "t-cli", "chat", "--input", turn,
                  "--after", "45", "--app", APP)  # fmt: skip
    assert said.exit_code == 0, said.output
    bad = invoke(db_url, "submit", APP, "chat", "--job-id", "j-bad", "--input", turn,
                 "--after", "later")  # fmt: skip
    assert bad.exit_code != 0 and "not a duration" in bad.output
    with keel.App(db_url) as reader:
        runs = reader.list_runs()
    assert len(runs) == 2, "the refused one admitted nothing"
    delays = sorted(round(float(r["not_before"]) - float(r["created_at"])) for r in runs)
    assert delays == [45, 600]
    assert all(r["status"] == "queued" for r in runs)
