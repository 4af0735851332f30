"""Completion webhooks from every surface that submits (Python, Keel's HTTP API, the CLI, the
Agent Server protocol), on both backends, to a real receiver on 127.0.0.1: signed, once per
move of the run, dead-lettered by a receiver that refuses and revived by `keel effects retry`,
and refused at submit for a private address not allowed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import httpx
import pytest
from langgraph_sdk import get_sync_client

import keel
from keel.core.errors import WebhookRefused
from keel.core.webhooks import new_secret
from keel.service.api import create_app
from keel.service.metrics import metrics_for
from tests.support.checks import wait_until
from tests.support.graphs import ask_graph, echo_graph
from tests.support.slack_fake import uvicorn_server
from tests.support.webhook_receiver import Receiver, receiving

SECRET = new_secret()
TOKEN = "hooks-uDeR5dRA6xRND-i2YDAU9oqX9TiuMYR_llVUKXGVjNA"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(SECRET) as r:
        yield r


@pytest.fixture
def app(make_app: Callable[..., keel.App]) -> keel.App:
    made = make_app(webhook_secret=SECRET, webhook_allow_hosts=["127.0.0.1"], webhook_attempts=3)
    made.workflow("echo")(echo_graph)
    made.workflow("ask")(ask_graph)
    return made


def drain(app: keel.App) -> None:
    """Execute what is queued and deliver what is due, then return."""
    app.run_worker(concurrency=2, stop_when_idle=True, handle_signals=False)


def test_a_finished_run_tells_its_webhook_once_signed(app: keel.App, receiver: Receiver) -> None:
    run = app.submit("echo", {"text": "hi"}, job_id="j-1", webhook=receiver.url)
    drain(app)
    (delivery,) = receiver.all()
    assert delivery.valid and delivery.id == f"webhook:{run.run_id}:0"
    assert delivery.json["type"] == "run.completed"
    data = delivery.json["data"]
    assert (data["run_id"], data["job_id"], data["status"]) == (run.run_id, "j-1", "completed")
    assert data["output"] == {"text": "hi", "out": "HI"}
    (intent,) = app.effect_intents(run_id=run.run_id)
    assert (intent["effect"], intent["status"]) == ("keel.webhook", "delivered")
    # The same submit again is the same run: no second registration, no second webhook.
    app.submit("echo", {"text": "hi"}, job_id="j-1", webhook=receiver.url)
    drain(app)
    assert len(receiver.all()) == 1


def test_pauses_and_ends_are_told_when_asked(app: keel.App, receiver: Receiver) -> None:
    events = ["interrupted", "completed"]
    run = app.submit("ask", {}, thread_id="t-ask", webhook=receiver.url, webhook_on=events)
    drain(app)
    wait_until(lambda: len(receiver.all()) == 1, 10, "the pause's webhook")
    app.resume("t-ask", "yes")
    drain(app)
    got = receiver.all()
    assert [d.json["type"] for d in got] == ["run.interrupted", "run.completed"]
    assert [d.id for d in got] == [f"webhook:{run.run_id}:0", f"webhook:{run.run_id}:1"]
    assert all(d.valid for d in got)
    # Not asked for: a cancelled run says nothing.
    quiet = app.submit("ask", {}, thread_id="t-quiet", webhook=receiver.url)
    drain(app)
    app.cancel(quiet.run_id)
    drain(app)
    assert [d.json["data"]["status"] for d in receiver.all()[2:]] == ["cancelled"]


def test_a_refused_delivery_is_dead_until_keel_effects_retry(
    app: keel.App, receiver: Receiver, db_url: str
) -> None:
    metrics_for(app)  # counting from here
    receiver.answer = 400
    run = app.submit("echo", {"text": "x"}, webhook=receiver.url)
    drain(app)
    (intent,) = app.effect_intents(run_id=run.run_id)
    assert intent["status"] == "dead" and "400" in intent["error"]
    receiver.answer = 200
    retried = subprocess.run(
        [sys.executable, "-m", "keel", "effects", "retry", intent["intent_id"], "--db", db_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert retried.returncode == 0, retried.stderr
    drain(app)
    assert [d.status for d in receiver.all()] == [400, 200]
    assert {d.id for d in receiver.all()} == {intent["intent_id"]}
    assert app.effect_intents(run_id=run.run_id)[0]["status"] == "delivered"
    scraped = metrics_for(app).scrape().decode()
    assert 'keel_webhook_deliveries_total{outcome="refused"} 1.0' in scraped
    assert 'keel_webhook_deliveries_total{outcome="delivered"} 1.0' in scraped
    assert 'keel_effect_intents{effect="keel.webhook",state="delivered"} 1.0' in scraped


def test_private_addresses_and_unsigned_webhooks_are_refused_at_submit(
    make_app: Callable[..., keel.App], receiver: Receiver
) -> None:
    strict = make_app(webhook_secret=SECRET, webhook_allow_hosts=[])
    strict.workflow("echo")(echo_graph)
    for url in (receiver.url, "http://169.254.169.254/latest", "http://[::1]:80/x"):
        with pytest.raises(WebhookRefused, match="private address"):
            strict.submit("echo", {"text": "x"}, webhook=url)
    unsigned = make_app(webhook_allow_hosts=["127.0.0.1"])
    unsigned.workflow("echo")(echo_graph)
    with pytest.raises(WebhookRefused, match="KEEL_WEBHOOK_SECRET"):
        unsigned.submit("echo", {"text": "x"}, webhook=receiver.url)
    assert strict.list_runs() == []


def test_the_http_api_the_cli_and_the_protocol_take_a_webhook(
    app: keel.App, receiver: Receiver, db_url: str, tmp_path: object
) -> None:
    api = create_app(app, tokens={TOKEN: ["*"]})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with uvicorn_server(api) as url:
        refused = httpx.post(
            f"{url}/v1/runs",
            json={"workflow": "echo", "job_id": "h-0", "input": {}, "webhook": "http://10.0.0.1/"},
            headers=auth,
        )
        assert (refused.status_code, refused.json()["error"]) == (422, "webhook_refused")
        made = httpx.post(
            f"{url}/v1/runs",
            json={
                "workflow": "echo",
                "job_id": "h-1",
                "input": {"text": "a"},
                "webhook": receiver.url,
                "webhook_on": ["completed"],
            },
            headers=auth,
        )
        assert made.status_code == 201, made.text
        client = get_sync_client(url=url, headers=auth)
        thread = client.threads.create()
        protocol_run = client.runs.create(
            thread["thread_id"], "echo", input={"text": "b"}, webhook=receiver.url
        )
        assert protocol_run["kwargs"]["webhook"] == receiver.url
    env = {
        "KEEL_WEBHOOK_SECRET": SECRET,
        "KEEL_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
        "KEEL_DATABASE_URL": db_url,
        "PATH": "/usr/bin:/bin",
    }
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "keel",
            "submit",
            "tests.support.apps.webhooks:app",
            "echo",
            "--job-id",
            "c-1",
            "--input",
            '{"text": "c"}',
            "--webhook",
            receiver.url,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert cli.returncode == 0, cli.stderr
    drain(app)
    bodies = {d.id.split(":")[1]: d.json for d in receiver.all()}
    assert len(bodies) == 3 and all(d.valid for d in receiver.all())
    protocol = bodies[protocol_run["run_id"]]
    assert (protocol["status"], protocol["thread_id"]) == ("success", thread["thread_id"])
    assert protocol["assistant_id"] == protocol_run["assistant_id"]
    assert protocol["webhook_event"] == "completed"
    ours = [b for k, b in bodies.items() if k != protocol_run["run_id"]]
    assert sorted(b["data"]["job_id"] for b in ours) == ["c-1", "h-1"]
    assert json.loads(cli.stdout)["job_id"] == "c-1"
