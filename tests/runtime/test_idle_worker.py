"""A quiet worker on PostgreSQL: it claims when woken (NOTIFY), takes a dead worker's run over
when its lease expires and applies a deadline when it falls due, all without polling; idle, it
makes at most one round trip a second (counted at the driver: tests/support/roundtrips.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.runtime.worker import Worker
from tests.support.checks import wait_until
from tests.support.graphs import echo_graph, held_graph
from tests.support.roundtrips import counting
from tests.support.workers import claim, execute

AppFactory = Callable[..., keel.App]
pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)
NO_POLL = 3600.0
"""A safety poll that never comes within a test: whatever the worker does, it was told to."""


@contextmanager
def running(app: keel.App, **options: Any) -> Iterator[Worker]:
    worker = Worker(app.aio.runtime, concurrency=2, **options)
    loop = app.aio.runtime.portal.loop
    future = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        future.result(timeout=30)


def status(app: keel.App, run_id: str) -> str:
    return app.get_run(run_id).status


def test_an_idle_worker_makes_at_most_one_round_trip_a_second(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    app.list_runs()  # the pool is open before counting starts
    with running(app):
        wait_until(lambda: app.workers(), 10, "the worker to start")
        time.sleep(1.0)  # its first looks (at start, and when LISTEN connects) are over
        with counting() as count:
            time.sleep(10.0)  # two safety polls and one heartbeat
        trips = count.trips
    assert trips <= 10, count.kinds


def test_a_quiet_worker_claims_when_notified(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    submitter = make_app()  # another connection pool: the wake-up crosses the database
    submitter.workflow("echo")(echo_graph)
    with running(app, safety_poll_interval=NO_POLL) as worker:
        wait_until(lambda: app.workers(), 10, "the worker to start")
        time.sleep(0.5)
        run = submitter.submit("echo", job_id="notified", input={"text": "hi"})["run_id"]
        wait_until(lambda: status(submitter, run) == "completed", 15, "the notified claim")
    assert worker.stats.claimed == 1


def test_a_run_admitted_while_a_quiet_worker_looks_is_not_missed(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wake-up of a run admitted after the worker's claim found nothing, but before its
    look ended, starts another look: it was cleared after the look, and the run waited for the
    next safety poll (5 s by default; here never)."""
    app = make_app()
    app.workflow("echo")(echo_graph)
    submitter = make_app()
    submitter.workflow("echo")(echo_graph)
    submitter.workflow("elsewhere")(echo_graph)  # served by no worker: its NOTIFY finds nothing
    store = app.aio.runtime.store
    looked = store.next_due
    armed, admitted = asyncio.Event(), []

    async def next_due(*args: Any, **kwargs: Any) -> Any:
        due = await looked(*args, **kwargs)
        if armed.is_set() and not admitted:
            # After the claim found nothing: a run is admitted, and its NOTIFY reaches this
            # worker's listener before the look ends.
            admitted.append(
                await asyncio.to_thread(
                    lambda: submitter.submit("echo", job_id="mid-look", input={"text": "hi"})
                )
            )
            await asyncio.sleep(0.3)
        return due

    monkeypatch.setattr(store, "next_due", next_due)
    with running(app, safety_poll_interval=NO_POLL) as worker:
        wait_until(lambda: app.workers(), 10, "the worker to start")
        time.sleep(0.5)
        app.aio.runtime.portal.loop.call_soon_threadsafe(armed.set)
        submitter.submit("elsewhere", job_id="wakes-only", input={"text": "hi"})
        wait_until(lambda: bool(admitted), 10, "a run admitted during the worker's look")
        run = admitted[0]["run_id"]
        wait_until(lambda: status(submitter, run) == "completed", 15, "the mid-look run's claim")
    assert worker.stats.claimed == 1


def test_a_quiet_worker_takes_a_dead_workers_run_over_when_its_lease_expires(
    make_app: AppFactory,
) -> None:
    app = make_app(lease_ttl=2)
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="orphan", input={"text": "hi"})["run_id"]
    claim(app, "w-dead")  # claimed, never executed, never renewed: its lease expires in 2 s
    with running(app, safety_poll_interval=NO_POLL) as worker:
        wait_until(lambda: status(app, run) == "completed", 20, "the takeover")
    kinds = [e["kind"] for e in app.get_run(run).timeline]
    assert "lease.takeover" in kinds
    assert worker.stats.claimed == 1


class GateState(TypedDict, total=False):
    log: list[str]


def gate_graph() -> StateGraph:
    def gate(state: GateState) -> dict[str, Any]:
        decision = keel.approval("manager", payload={}, timeout="2s", on_timeout="reject")
        return {"log": [decision.decision]}

    g = StateGraph(GateState)
    g.add_node("gate", gate)
    g.add_edge(START, "gate")
    g.add_edge("gate", END)
    return g


def test_a_quiet_worker_applies_a_deadline_when_it_falls_due(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("gate")(gate_graph)
    run = app.submit("gate", job_id="deadline", input={})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "waiting"  # the deadline is 2 s away
    with running(app, safety_poll_interval=NO_POLL):
        wait_until(lambda: status(app, run) == "completed", 20, "the deadline's policy")
    assert app.get_run(run).decision == "rejected"


def test_a_full_quiet_worker_is_not_sent_to_the_database_by_wake_ups(
    make_app: AppFactory,
) -> None:
    """Both slots busy: each admission's NOTIFY wakes the worker, which has no slot to claim
    into and so asks the database nothing; once its runs end it takes every queued run."""
    release = threading.Event()
    app = make_app()
    app.workflow("held")(held_graph(release))
    app.workflow("echo")(echo_graph)
    with running(app, safety_poll_interval=NO_POLL) as worker:
        wait_until(lambda: app.workers(), 10, "the worker to start")
        held = [app.submit("held", job_id=f"held-{i}", input={})["run_id"] for i in range(2)]
        wait_until(lambda: all(status(app, r) == "running" for r in held), 10, "both slots to fill")
        time.sleep(0.5)  # the looks that followed the claims are over
        with counting() as count:
            queued = [
                app.submit("echo", job_id=f"woke-{i}", input={"text": "hi"})["run_id"]
                for i in range(5)
            ]
            time.sleep(1.0)  # every NOTIFY has reached the worker's listener
        # The five admissions' own round trips (and at most one heartbeat), nothing else.
        assert count.statements <= 5 + 1, count.kinds
        assert all(status(app, r) == "queued" for r in queued)
        release.set()
        for r in [*held, *queued]:
            wait_until(lambda r=r: status(app, r) == "completed", 20, f"run {r} to complete")
    assert worker.stats.claimed == 7


def test_a_full_quiet_worker_still_applies_a_deadline_when_it_falls_due(
    make_app: AppFactory,
) -> None:
    release = threading.Event()
    app = make_app()
    app.workflow("gate")(gate_graph)
    app.workflow("held")(held_graph(release))
    gate = app.submit("gate", job_id="deadline-full", input={})["run_id"]
    assert execute(app, *claim(app, "w-a")) == "waiting"  # the deadline is 2 s away
    try:
        with running(app, safety_poll_interval=NO_POLL):
            held = [app.submit("held", job_id=f"hold-{i}", input={})["run_id"] for i in range(2)]
            wait_until(
                lambda: all(status(app, r) == "running" for r in held), 10, "both slots to fill"
            )
            # Wake-ups while full, and the deadline falls due with no slot free.
            for i in range(3):
                app.submit("gate", job_id=f"wake-{i}", input={})
            wait_until(lambda: status(app, gate) != "waiting", 20, "the deadline's policy")
            assert all(status(app, r) == "running" for r in held)
            release.set()
            wait_until(lambda: status(app, gate) == "completed", 20, "the gate run to resume")
    finally:
        release.set()
    assert app.get_run(gate).decision == "rejected"
