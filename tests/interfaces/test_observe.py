"""Live events over SSE and Prometheus metrics, through a real server on 127.0.0.1."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from langgraph.graph import END, START, StateGraph
from prometheus_client.parser import text_string_to_metric_families

import keel
from keel.service import create_app
from tests.support.apps.service import LiveServer, register
from tests.support.apps.service import State as ReviewState
from tests.support.checks import wait_until
from tests.support.in_doubt import in_doubt
from tests.support.notifiers import Recorder
from tests.support.providers import Provider
from tests.support.service_client import ADMIN, TOKENS, Service, bearer
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def sse(response: httpx.Response) -> Iterator[dict[str, str]]:
    """The events of a text/event-stream response, as they arrive (pings skipped)."""
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            event[field] = value.removeprefix(" ")


def test_sse_replays_then_streams_and_resumes_after_a_drop_without_gaps_or_repeats(
    svc: Service,
) -> None:
    app = svc.app
    run = svc.http.post(
        "/v1/runs", json={"workflow": "review", "job_id": "sse-1", "input": {"topic": "t"}}
    )
    run_id = run.json()["run_id"]
    drain(app)
    assert app.get_run(run_id).status == "waiting"
    seen: list[dict[str, str]] = []
    headers = bearer(ADMIN)
    with httpx.Client(base_url=svc.url, timeout=10) as client:
        with client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as first:
            assert first.status_code == 200
            assert first.headers["content-type"].startswith("text/event-stream")
            for event in sse(first):
                seen.append(event)
                if event["event"] == "wait.registered" or len(seen) >= 50:
                    break  # the connection drops here, the run still waiting
        assert seen and seen[-1]["event"] == "wait.registered", seen
        # Meanwhile the run goes on: a decision, then a worker finishes it.
        app.approve(run_id, by="editor")
        worker = threading.Thread(target=drain, args=(app,))
        worker.start()
        with client.stream(
            "GET", f"/v1/runs/{run_id}/events", headers={**headers, "Last-Event-ID": seen[-1]["id"]}
        ) as second:
            for event in sse(second):
                seen.append(event)
                if event["event"] == "end":
                    break
        worker.join(30)
    assert seen[-1]["event"] == "end" and '"completed"' in seen[-1]["data"]
    ids = [int(e["id"]) for e in seen[:-1]]
    timeline = app.get_run(run_id).timeline
    # Exactly the run's timeline, in order, each event once, across the dropped connection.
    assert ids == [int(e["event_id"]) for e in timeline]
    assert [e["event"] for e in seen[:-1]] == [e["kind"] for e in timeline]
    # A client that comes back after the end gets nothing twice, just the end again.
    with (
        httpx.Client(base_url=svc.url, timeout=10) as client,
        client.stream(
            "GET", f"/v1/runs/{run_id}/events", headers={**headers, "Last-Event-ID": str(ids[-1])}
        ) as again,
    ):
        assert [e["event"] for e in sse(again)] == ["end"]


def test_sse_refuses_unknown_runs_bad_cursors_and_missing_tokens(svc: Service) -> None:
    assert svc.http.get("/v1/runs/nope-0123456789abcdef/events").status_code == 404
    run = svc.http.post(
        "/v1/runs", json={"workflow": "review", "job_id": "sse-2", "input": {"topic": "t"}}
    )
    run_id = run.json()["run_id"]
    bad = svc.http.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "ten"})
    assert bad.status_code == 400
    # Past a 64-bit integer: refused before the stream starts (it was a 200, then a dropped
    # connection when the query overflowed).
    for after in (2**63, 10**20):
        past = svc.http.get(f"/v1/runs/{run_id}/events?after={after}", timeout=10)
        assert past.status_code == 422, past.text
        assert past.json()["error"] == "invalid_request"
        assert "after" in past.json()["message"]
    assert httpx.get(f"{svc.url}/v1/runs/{run_id}/events").status_code == 401


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_report_runs_queue_effects_in_doubt_approvals_and_takeovers(
    make_app: AppFactory,
) -> None:
    app = register(make_app(lease_ttl=5))
    server = LiveServer(create_app(app, tokens=TOKENS)).__enter__()  # counts from here on
    try:
        # A payment whose charge is in doubt after two takeovers (tests/support/in_doubt.py).
        in_doubt(make_app, Provider(), delivered=False)
        # A review approved (its effect sent), one waiting for its approval, one queued.
        done = app.submit("review", job_id="m-1", input={"topic": "a"})["run_id"]
        waiting = app.submit("review", job_id="m-2", input={"topic": "b"})["run_id"]
        drain(app)
        app.approve(done, by="editor")
        drain(app)
        app.submit("other", job_id="m-3", input={"topic": "c"})
        assert app.get_run(done).status == "completed"
        assert app.get_run(waiting).status == "waiting"
        m = scrape(server.url)
    finally:
        server.__exit__(None, None, None)

    def value(name: str, **labels: str) -> float:
        return m.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value("keel_database_up") == 1
    assert value("keel_runs", workflow="review", version="1", status="completed") == 1
    assert value("keel_runs", workflow="review", version="1", status="waiting") == 1
    assert value("keel_runs", workflow="pay", version="1", status="waiting") == 1
    assert value("keel_runs", workflow="other", version="1", status="queued") == 1
    assert value("keel_queue_depth") == 1
    assert value("keel_queue_oldest_age_seconds") >= 0
    assert value("keel_effects", effect="charge", state="in_doubt") == 1
    assert value("keel_effects", effect="notify_requester", state="sent") == 1
    assert value("keel_effects_in_doubt") == 1
    assert value("keel_waits_pending", kind="approval") == 1
    assert value("keel_waits_pending", kind="effect") == 1
    assert value("keel_sweeper_lag_seconds") == 0
    assert value("keel_outbox_backlog") == 0
    # Counted in this process: the thief's claim and the resuming worker's were takeovers.
    assert value("keel_lease_takeovers_total") == 2
    # `workflow` is the name and `version` apart on every metric, so counters join the gauges.
    review = {"workflow": "review", "version": "1"}
    assert value("keel_effects_marked_in_doubt_total", workflow="pay", version="1") == 1
    assert value("keel_runs_finished_total", **review, status="completed") == 1
    assert value("keel_run_duration_seconds_count", **review, status="completed") == 1
    assert value("keel_step_duration_seconds_count", **review, node="notify") == 1
    assert not [key for key in m if "@" in dict(key[1]).get("workflow", "")]
    assert (
        value(
            "keel_effect_call_duration_seconds_count",
            effect="notify_requester",
            call="perform",
            outcome="ok",
        )
        == 1
    )
    assert value("keel_heartbeat_failures_total") == 0
    assert value("keel_events_total", kind="lease.takeover") == 2


def test_metrics_show_an_outbox_backlog_a_delivery_failure_and_the_sweepers_lag(
    make_app: AppFactory,
) -> None:
    clock = keel.ManualClock()
    app = register(make_app(clock=clock, lease_ttl=5))
    app.add_notifier(Recorder("flaky", failures=[keel.TransientError("429 slow down")]))
    app.add_notifier(Recorder("broken", failures=[RuntimeError("invalid_auth")]))
    server = LiveServer(create_app(app, tokens=TOKENS)).__enter__()
    try:
        run_id = app.submit("review", job_id="o-1", input={"topic": "a", "timeout": "60s"})[
            "run_id"
        ]
        drain(app)  # the request: delivered by neither (one to retry later, one failed)
        assert app.get_run(run_id).status == "waiting"
        clock.advance(600)  # the deadline passed 540 s ago and no sweeper ran since
        m = scrape(server.url)
        drain(app)  # a sweep: the deadline applied, the retry delivered
        after = scrape(server.url)
    finally:
        server.__exit__(None, None, None)

    def value(found: dict[Any, float], name: str, **labels: str) -> float:
        return found.get((name, tuple(sorted(labels.items()))), 0.0)

    assert value(m, "keel_outbox_backlog") == 1
    assert value(m, "keel_outbox", state="queued") == 1
    assert value(m, "keel_outbox", state="failed") == 1
    assert value(m, "keel_outbox_oldest_age_seconds") == pytest.approx(600, abs=1)
    assert value(m, "keel_outbox_delivery_failures_total", outcome="failed") == 1
    assert value(m, "keel_sweeper_lag_seconds") == pytest.approx(540, abs=1)
    assert value(m, "keel_waits_pending", kind="approval") == 1
    assert value(m, "keel_waits_oldest_age_seconds", kind="approval") == pytest.approx(600, abs=1)

    assert app.get_run(run_id).status == "completed"  # rejected by the deadline policy
    assert value(after, "keel_sweeper_lag_seconds") == 0
    assert value(after, "keel_outbox_backlog") == 0
    assert value(after, "keel_waits_pending", kind="approval") == 0
    assert value(after, "keel_outbox_delivery_failures_total", outcome="failed") == 1


def held(gate: threading.Event) -> StateGraph:
    """One node that holds its run (and its worker's lease) until `gate` opens."""

    def hold(state: dict[str, Any]) -> dict[str, Any]:
        assert gate.wait(30)
        return {"topic": "done"}

    g = StateGraph(ReviewState)
    g.add_node("hold", hold)
    g.add_edge(START, "hold")
    g.add_edge("hold", END)
    return g


@pytest.mark.parametrize("backend", ["sqlite"])
def test_metrics_count_heartbeat_failures_and_database_errors_by_kind(
    make_app: AppFactory, db_url: str
) -> None:
    gate = threading.Event()
    app = make_app(lease_ttl=6)  # a renewal every 2 s
    app.aio.runtime.connector._busy_timeout_ms = 100  # a locked file fails a write fast
    app.workflow("held")(lambda: held(gate))
    seen: list[logging.LogRecord] = []
    counted = logging.Handler()
    counted.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("keel").addHandler(counted)
    server = LiveServer(create_app(app, tokens=TOKENS)).__enter__()
    worker = threading.Thread(target=drain, args=(app,), kwargs={"within": 60})
    try:
        run_id = app.submit("held", job_id="h-1", input={"topic": "t"})["run_id"]
        worker.start()
        wait_until(lambda: app.get_run(run_id).status == "running", 20, "the run to start")
        # Another process holds the database's write lock (a long backup, a stuck writer).
        path = db_url.removeprefix("sqlite:///")
        blocker = sqlite3.connect(path, isolation_level=None, timeout=30)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            wait_until(
                lambda: any(getattr(r, "event", None) == "heartbeat.failed" for r in seen),
                20,
                "a renewal to fail on the locked file",
            )
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        gate.set()
        worker.join(60)
        assert app.get_run(run_id).status == "completed"  # a database fault fails no run
        m = scrape(server.url)
    finally:
        gate.set()
        server.__exit__(None, None, None)
        logging.getLogger("keel").removeHandler(counted)

    failures = [r for r in seen if getattr(r, "event", None) == "heartbeat.failed"]
    locked = [r for r in seen if getattr(r, "db_error", None) == "OperationalError"]
    assert failures and all("locked" in r.getMessage() for r in failures)
    key = ("keel_heartbeat_failures_total", ())
    assert m[key] == len(failures)
    kind = ("keel_database_errors_total", (("kind", "OperationalError"),))
    assert m[kind] == len(locked) >= len(failures)
