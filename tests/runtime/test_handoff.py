"""A run submitted beside an idle worker of the same process is claimed in its admission's
commit (keel.runtime.handoff): one transaction and one durable commit instead of two, the
worker's own claim statement, its slots respected. SQLite only: on PostgreSQL each stays its
own statement."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.runtime.handoff import Handoff
from keel.runtime.worker import Worker
from tests.runtime.test_step_transaction import traced
from tests.support.checks import wait_until

AppFactory = Callable[..., keel.App]
pytestmark = pytest.mark.parametrize("backend", ["sqlite"])


class State(TypedDict, total=False):
    n: int


def chain() -> StateGraph:
    g = StateGraph(State)
    g.add_node("a", lambda s: {"n": s.get("n", 0) + 1})
    g.add_edge(START, "a")
    g.add_edge("a", END)
    return g


@contextmanager
def running(app: keel.App, concurrency: int = 1) -> Iterator[Worker]:
    worker = Worker(app.aio, concurrency=concurrency, poll_interval=0.05)
    loop = app.aio.portal.loop
    future = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        wait_until(lambda: bool(app.aio._takers), 10, "the worker to offer its slot")
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        future.result(timeout=30)


def submit_traced(app: keel.App, job_id: str) -> tuple[str, list[list[str]]]:
    async def go() -> tuple[str, list[list[str]]]:
        async with traced(app) as trace:
            run = await app.aio.submit("chain", job_id=job_id, input={"n": 0})
        return run.run_id, [t.statements for t in trace.transactions]

    return app.aio.portal.call(go())


def admission(transactions: list[list[str]]) -> list[str]:
    [found] = [t for t in transactions if any("INSERT INTO keel_runs" in s for s in t)]
    return found


def claims(statements: list[str]) -> bool:
    """Whether the transaction claimed a run (the claim's own timeline event)."""
    return any("'lease.claimed'" in s and "INSERT INTO keel_events" in s for s in statements)


def test_a_run_submitted_beside_an_idle_worker_is_claimed_in_its_admission_commit(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("chain")(chain)
    with running(app) as worker:
        run_id, transactions = submit_traced(app, "handed-1")
        # The admission and the claim: one transaction, committed once.
        assert claims(admission(transactions)), transactions
        assert len(transactions) == 1, transactions
        wait_until(lambda: app.get_run(run_id).status == "completed", 10, "the run to end")
        assert worker.stats.claimed == 1
    kinds = [e["kind"] for e in app.get_run(run_id).timeline]
    assert kinds[:2] == ["admitted", "lease.claimed"], kinds
    assert kinds[-1] == "status.completed", kinds


def test_a_busy_worker_takes_no_run_with_its_admission(make_app: AppFactory) -> None:
    """A worker at its concurrency offers no slot: the admission commits alone and the run
    waits, queued, until the worker's own claim loop takes it."""
    app = make_app()
    release = threading.Event()

    def hold(state: State) -> dict[str, Any]:
        release.wait(10)
        return {"n": 1}

    def held() -> StateGraph:
        g = StateGraph(State)
        g.add_node("hold", hold)
        g.add_edge(START, "hold")
        g.add_edge("hold", END)
        return g

    app.workflow("held")(held)
    app.workflow("chain")(chain)
    with running(app, concurrency=1) as worker:
        first = app.submit("held", job_id="busy-1", input={"n": 0})["run_id"]
        wait_until(lambda: app.get_run(first).status == "running", 10, "the first run to run")
        second, transactions = submit_traced(app, "busy-2")
        assert not claims(admission(transactions)), transactions
        assert app.get_run(second).status == "queued"
        release.set()
        wait_until(lambda: app.get_run(second).status == "completed", 10, "the second run")
        assert worker.stats.claimed == 2
    assert app.get_run(first).status == "completed"


def test_a_duplicate_submit_claims_nothing(make_app: AppFactory) -> None:
    """The same job and input again is the same run: no claim rides on its admission, and the
    worker's slot is given back."""
    app = make_app()
    app.workflow("chain")(chain)
    with running(app) as worker:
        run_id, _ = submit_traced(app, "dup-1")
        wait_until(lambda: app.get_run(run_id).status == "completed", 10, "the run to end")
        again, transactions = submit_traced(app, "dup-1")
        assert again == run_id
        assert not any(claims(t) for t in transactions), transactions
        assert worker._handoff.reserved == 0
        assert worker.stats.claimed == 1


def test_a_claim_that_commits_after_its_worker_stopped_gives_the_run_back(
    make_app: AppFactory,
) -> None:
    """The worker stopped between offering its slot and the admission's commit: the run it
    claimed is released at once (queued again), never left under a lease nobody heartbeats."""
    app = make_app()
    app.workflow("chain")(chain)
    started: list[str] = []
    handoff: Handoff

    def stops_while_offering(reserved: int) -> bool:
        handoff.close()  # the worker stops right after this check
        return True

    async def go() -> str:
        nonlocal handoff
        rt = app.aio
        await rt.open()
        handoff = Handoff(
            rt.services,
            rt.workflows,
            "w-stopping",
            free=stops_while_offering,
            start=lambda lease, row: started.append(lease.run_id),
        )
        rt.add_taker(handoff.open(asyncio.get_running_loop()))
        try:
            return (await rt.submit("chain", job_id="stop-1", input={"n": 0})).run_id
        finally:
            rt.remove_taker(handoff)

    run_id = app.aio.portal.call(go())
    assert started == []
    assert handoff.reserved == 0
    run = app.get_run(run_id)
    assert run.status == "queued"
    kinds = [e["kind"] for e in run.timeline]
    assert kinds[:2] == ["admitted", "lease.claimed"], kinds
    assert kinds[-1] == "status.queued", kinds
