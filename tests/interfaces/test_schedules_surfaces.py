"""Schedules through every surface, on both backends: `keel schedules ...` (typer's CliRunner on
the test's database), Keel's HTTP API at /v1/schedules and the Agent Server protocol's crons
driven by langgraph-sdk, both on a real uvicorn server on 127.0.0.1. The oracle is the Python
API on the same database; a tick fired by hand (`fire_due`) shows a cron made over HTTP
starting its run."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import APIStatusError, NotFoundError
from typer.testing import CliRunner, Result

import keel
from keel.cli.commands import cli
from keel.runtime.schedules import fire_due
from keel.service import create_app
from keel.service.agent_server.shapes import assistant_id_of
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, READER, TOKENS, Service
from tests.support.thread_graphs import register

APP = "tests.support.thread_graphs:fresh_app"
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
ORACLE_CRON = {
    "cron_id",
    "assistant_id",
    "thread_id",
    "on_run_completed",
    "end_time",
    "schedule",
    "timezone",
    "created_at",
    "updated_at",
    "payload",
    "user_id",
    "next_run_date",
    "metadata",
    "enabled",
}
"""The fields of langgraph-sdk's `Cron` (langgraph_sdk.schema)."""


def _invoke(db_url: str, tmp_path: Path, *args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}
    env.update(KEEL_DATABASE_URL=db_url, KEEL_ARTIFACTS_DIR=str(tmp_path / "a"), COLUMNS="200")
    result = CliRunner().invoke(cli, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_the_cli_manages_schedules(
    db_url: str, tmp_path: Path, make_app: Callable[..., keel.App]
) -> None:
    app = register(make_app())
    made = _invoke(
        db_url, tmp_path, "schedules", "create", "hourly", "chat", "--cron", "0 * * * *",
        "--timezone", "Europe/Paris", "--input", json.dumps(CHAT), "--app", APP, "--json",
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["next_tick"] == app.schedules.get("hourly")["next_tick"]
    listed = _invoke(db_url, tmp_path, "schedules", "list", "--db", db_url)
    assert "hourly" in listed.stdout and "cron 0 * * * * Europe/Paris" in listed.stdout
    assert _invoke(db_url, tmp_path, "schedules", "pause", "hourly", "--db", db_url).exit_code == 0
    assert app.schedules.get("hourly")["paused"] is True
    assert _invoke(db_url, tmp_path, "schedules", "resume", "hourly", "--db", db_url).exit_code == 0
    assert app.schedules.get("hourly")["paused"] is False
    fired = _invoke(db_url, tmp_path, "schedules", "trigger", "hourly", "--app", APP, "--json")
    run_id = json.loads(fired.stdout)["run_id"]
    assert app.get_run(run_id).run["workflow"] == "chat"
    bad = _invoke(
        db_url, tmp_path, "schedules", "create", "x", "chat", "--cron", "* *", "--app", APP
    )
    assert bad.exit_code != 0 and "5 fields" in bad.output
    missing = _invoke(db_url, tmp_path, "schedules", "delete", "nope", "--db", db_url)
    assert missing.exit_code != 0 and "no schedule 'nope'" in missing.output
    assert _invoke(db_url, tmp_path, "schedules", "delete", "hourly", "--db", db_url).exit_code == 0
    assert app.schedules.count() == 0
    assert app.get_run(run_id).run["status"] == "queued", "its runs stay"


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[Service]:
    app = register(make_app(clock=keel.ManualClock()))
    with LiveServer(create_app(app, tokens=TOKENS)) as server:
        service = Service(app, server.url)
        yield service
        service.close()


def test_the_http_api_manages_schedules(served: Service) -> None:
    http = served.http
    body = {"name": "s1", "workflow": "chat", "every": 60, "input": CHAT, "overlap": "allow"}
    made = http.post("/v1/schedules", json=body)
    assert made.status_code == 201, made.text
    assert made.json() == served.app.schedules.get("s1")
    again = http.post("/v1/schedules", json=body)
    assert (again.status_code, again.json()["error"]) == (409, "schedule_exists")
    bad = http.post("/v1/schedules", json={**body, "name": "s2", "cron": "nope", "every": None})
    assert (bad.status_code, bad.json()["error"]) == (400, "bad_request")
    unknown = http.post("/v1/schedules", json={**body, "name": "s3", "workflow": "nope"})
    assert unknown.status_code == 422
    assert served.app.schedules.count() == 1, "refusals create nothing"
    reader = served.as_(READER)
    assert reader.post("/v1/schedules", json={**body, "name": "s4"}).status_code == 403
    assert reader.get("/v1/schedules").json()["total"] == 1
    patched = http.patch("/v1/schedules/s1", json={"cron": "*/5 * * * * *"})
    assert patched.json()["cron"] == "*/5 * * * * *" and patched.json()["every"] is None
    assert http.post("/v1/schedules/s1/pause").json()["paused"] is True
    assert http.post("/v1/schedules/s1/resume").json()["next_tick"] is not None
    triggered = http.post("/v1/schedules/s1/trigger")
    assert triggered.status_code == 201
    assert served.app.get_run(triggered.json()["run_id"]).run["status"] == "queued"
    assert http.delete("/v1/schedules/s1").status_code == 204
    gone = http.get("/v1/schedules/s1")
    assert (gone.status_code, gone.json()["error"]) == (404, "schedule_not_found")


def _fire(app: keel.App) -> list[Any]:
    rt = app.aio.runtime
    return rt.portal.call(fire_due(rt, rt.workflows))


def test_langgraph_sdk_crons(served: Service) -> None:
    client = get_sync_client(url=served.url, api_key=ADMIN)
    cron: dict[str, Any] = dict(
        client.crons.create("chat", schedule="*/1 * * * * *", input=CHAT, metadata={"k": 1})
    )
    assert set(cron) == ORACLE_CRON
    assert cron["assistant_id"] == assistant_id_of("chat") and cron["enabled"] is True
    thread = client.threads.create()
    on_thread: dict[str, Any] = dict(
        client.crons.create_for_thread(
            thread["thread_id"],
            "chat",
            schedule="0 9 * * *",
            timezone="America/New_York",
            input=CHAT,
        )
    )
    assert on_thread["thread_id"] == thread["thread_id"]
    assert on_thread["timezone"] == "America/New_York"
    found = client.crons.search(assistant_id="chat")
    assert {c["cron_id"] for c in found} == {cron["cron_id"], on_thread["cron_id"]}
    assert [c["cron_id"] for c in client.crons.search(metadata={"k": 1})] == [cron["cron_id"]]
    # Metadata matches as JSON containment (PostgreSQL's `@>`): true is not 1, null not missing.
    assert client.crons.search(metadata={"k": True}) == []
    assert client.crons.search(metadata={"owner": None}) == []
    assert client.crons.count(thread_id=thread["thread_id"]) == 1
    served.app.aio.runtime.clock.advance(1)  # type: ignore[attr-defined]
    (tick,) = _fire(served.app)
    assert tick.outcome == "fired" and served.app.get_run(tick.run_id).run["workflow"] == "chat"
    updated = client.crons.update(cron["cron_id"], enabled=False)
    assert updated["enabled"] is False and updated["next_run_date"] is None
    with pytest.raises(APIStatusError) as refused:
        client.crons.create("chat", schedule="0 9 * * *", input=CHAT, webhook="http://x/y")
    assert refused.value.status_code == 422
    with pytest.raises(NotFoundError):
        client.crons.create_for_thread("no-such-thread", "chat", schedule="0 9 * * *")
    client.crons.delete(cron["cron_id"])
    client.crons.delete(on_thread["cron_id"])
    assert client.crons.count() == 0
    with pytest.raises(NotFoundError):
        client.crons.delete(cron["cron_id"])


def test_deleting_a_thread_deletes_its_crons(served: Service) -> None:
    """What `langgraph dev` does: after DELETE /threads/{id} its crons are gone from the crons
    API, and no tick of theirs brings the thread back."""
    client = get_sync_client(url=served.url, api_key=ADMIN)
    thread = client.threads.create()
    on_thread = client.crons.create_for_thread(
        thread["thread_id"], "chat", schedule="*/1 * * * * *", input=CHAT
    )
    kept = client.crons.create("chat", schedule="0 9 * * *", input=CHAT)
    client.threads.delete(thread["thread_id"])
    assert client.crons.search(thread_id=thread["thread_id"]) == []
    assert [c["cron_id"] for c in client.crons.search()] == [kept["cron_id"]]
    with pytest.raises(NotFoundError):
        client.crons.delete(on_thread["cron_id"])
    served.app.aio.runtime.clock.advance(5)  # type: ignore[attr-defined]
    assert _fire(served.app) == []
    with pytest.raises(NotFoundError):
        client.threads.get(thread["thread_id"])


def test_the_console_lists_schedules_with_their_ticks(served: Service) -> None:
    app = served.app
    app.schedules.create("pulse", "chat", every=60, input=CHAT)
    app.schedules.create("quiet", "chat", cron="0 9 * * *", input=CHAT, paused=True)
    app.aio.runtime.clock.advance(60)  # type: ignore[attr-defined]
    (tick,) = _fire(app)
    client = served.as_(None)
    assert client.get("/ui/login").status_code == 200
    nonce = client.cookies["keel_login_csrf"]
    assert client.post("/ui/login", data={"token": ADMIN, "csrf": nonce}).status_code == 303
    page = client.get("/ui/schedules").text
    rows = re.findall(r'<tr class="schedule">(.*?)</tr>', page, re.S)
    assert len(rows) == 2
    pulse, quiet = rows
    assert "every 60.0 s" in pulse and f'href="/ui/runs/{tick.run_id}"' in pulse
    assert "paused" in quiet and "never" in quiet and "0 9 * * * (UTC)" in quiet
