"""The console's reads, on both backends: filtered, paged, indexed run lists and open waits."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import keel
from keel.core.store.base import load_queries
from tests.support.graphs import echo_graph, notify_effect, review_graph
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def _app(make_app: AppFactory) -> tuple[keel.App, keel.ManualClock]:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    app.workflow("other")(echo_graph)
    app.workflow("review")(lambda: review_graph(notify_effect(Provider())))
    return app, clock


def _jobs(rows: list[dict]) -> list[str]:
    return [r["job_id"] for r in rows]


def test_filters_by_job_id_prefix_workflow_status_and_admission_time(
    make_app: AppFactory,
) -> None:
    app, clock = _app(make_app)
    start = clock.now()
    jobs = ["ticket-1", "ticket-10", "ticket-2", "a.b", "a_b-x", "axb", "ticket"]
    for n, job in enumerate(jobs):
        app.submit("other" if job == "ticket-2" else "echo", job_id=job, input={"n": [n]})
        clock.advance(60)
    assert _jobs(app.browse_runs(job_prefix="ticket-1")) == ["ticket-10", "ticket-1"]
    # LIKE's wildcard `_` and `.` are plain characters here.
    assert _jobs(app.browse_runs(job_prefix="a_")) == ["a_b-x"]
    assert _jobs(app.browse_runs(job_prefix="a.")) == ["a.b"]
    assert _jobs(app.browse_runs(job_prefix="ticket")) == [
        "ticket",
        "ticket-2",
        "ticket-10",
        "ticket-1",
    ]
    assert _jobs(app.browse_runs(workflow="other")) == ["ticket-2"]
    window = app.browse_runs(since=start + 60, until=start + 180)
    assert _jobs(window) == ["ticket-2", "ticket-10"]  # [since, until): 60 and 120 s in
    assert app.browse_runs(status="completed") == []
    assert len(app.browse_runs(status="queued")) == len(jobs)
    drain(app)
    assert len(app.browse_runs(status="completed", job_prefix="ticket")) == 4


def test_pages_are_newest_first_with_no_gap_or_repeat(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    for n in range(23):
        app.submit("echo", job_id=f"job-{n:02d}", input={"n": [n]})
        if n % 3:  # some share an admission time: the run id breaks the tie, stably
            clock.advance(1)
    seen: list[str] = []
    offset = 0
    while page := app.browse_runs(limit=10, offset=offset):
        seen += [r["run_id"] for r in page]
        offset += 10
    everything = app.browse_runs(limit=100)
    assert seen == [r["run_id"] for r in everything] and len(set(seen)) == 23
    times = [r["created_at"] for r in everything]
    assert times == sorted(times, reverse=True)


def test_each_run_says_how_many_waits_are_open_and_the_inbox_pages_by_kind(
    make_app: AppFactory,
) -> None:
    app, _ = _app(make_app)
    waiting = [
        app.submit("review", job_id=f"r-{n}", input={"to": f"x{n}@example.com"})["run_id"]
        for n in range(3)
    ]
    done = app.submit("echo", job_id="e-1", input={})["run_id"]
    drain(app)
    counts = {r["run_id"]: r["pending_waits"] for r in app.browse_runs()}
    assert counts == {**dict.fromkeys(waiting, 1), done: 0}
    app.approve(waiting[0], by="alice")
    assert {r["run_id"]: r["pending_waits"] for r in app.browse_runs()}[waiting[0]] == 0
    first = app.browse_pending_waits(kind="approval", limit=1)
    second = app.browse_pending_waits(kind="approval", limit=1, offset=1)
    assert {first[0]["run_id"], second[0]["run_id"]} == set(waiting[1:])
    assert app.browse_pending_waits(kind="effect") == []
    assert len(app.browse_pending_waits(kind=None)) == 2


def test_sqlite_answers_the_run_list_from_an_index_without_sorting(tmp_path) -> None:
    url = tmp_path / "plan.db"
    with keel.App(f"sqlite:///{url}") as app:
        app.migrate()
    sql = load_queries("sqlite")["browse_runs"]
    params = {
        "status": None,
        "workflow": None,
        "job_prefix": None,
        "job_prefix_end": None,
        "since": None,
        "until": None,
        "limit": 51,
        "offset": 0,
    }
    with sqlite3.connect(url) as db:
        plan = " | ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "keel_runs_created" in plan and "TEMP B-TREE" not in plan, plan
