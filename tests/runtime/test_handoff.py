"""A run submitted beside an idle worker of the same process is claimed in its admission's
commit (keel.runtime.handoff): one transaction and one durable commit instead of two (on
PostgreSQL one round trip), the worker's own claim statement, its slots respected."""

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
from keel.runtime.handoff import Handoff
from keel.runtime.worker import Worker
from tests.runtime.test_step_transaction import traced
from tests.support.checks import wait_until
from tests.support.graphs import held_graph

AppFactory = Callable[..., keel.App]


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
    worker = Worker(app.aio.runtime, concurrency=concurrency, poll_interval=0.05)
    loop = app.aio.runtime.portal.loop
    future = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        wait_until(lambda: bool(app.aio.runtime._takers), 10, "the worker to offer its slot")
        # Its first looks (as it starts, and on PostgreSQL when its LISTEN connects) are over:
        # a transaction traced from here on is the submit's or the decision's.
        time.sleep(0.5)
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        future.result(timeout=30)


def submit_traced(app: keel.App, job_id: str) -> tuple[str, list[list[str]], list[int]]:
    """The run, the statements of each write transaction its submit made, and (PostgreSQL)
    the round trips of each."""

    async def go() -> tuple[str, list[list[str]], list[int]]:
        async with traced(app) as trace:
            run = await app.aio.submit("chain", job_id=job_id, input={"n": 0})
        txs = trace.transactions
        return run.run_id, [t.statements for t in txs], [t.round_trips for t in txs]

    return app.aio.runtime.portal.call(go())


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
        run_id, transactions, round_trips = submit_traced(app, "handed-1")
        # The admission and the claim: one transaction, committed once, sent as one message.
        assert claims(admission(transactions)), transactions
        assert len(transactions) == 1, transactions
        if app.aio.runtime.store.dialect == "postgres":
            assert round_trips == [1], round_trips
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
    held = held_graph(release)
    app.workflow("held")(held)
    app.workflow("chain")(chain)
    with running(app, concurrency=1) as worker:
        first = app.submit("held", job_id="busy-1", input={"n": 0})["run_id"]
        wait_until(lambda: app.get_run(first).status == "running", 10, "the first run to run")
        second, transactions, _ = submit_traced(app, "busy-2")
        assert not claims(admission(transactions)), transactions
        assert app.get_run(second).status == "queued"
        release.set()
        wait_until(lambda: app.get_run(second).status == "completed", 10, "the second run")
        assert worker.stats.claimed == 2
    assert app.get_run(first).status == "completed"


def test_a_duplicate_submit_claims_only_what_is_claimable(make_app: AppFactory) -> None:
    """The same job and input again is the same run: the claim that rides on its admission
    takes what any claim would, here nothing (the run ended), and the worker's slot is given
    back; the run is not claimed again."""
    app = make_app()
    app.workflow("chain")(chain)
    with running(app) as worker:
        run_id, _, _ = submit_traced(app, "dup-1")
        wait_until(lambda: app.get_run(run_id).status == "completed", 10, "the run to end")
        again, _, _ = submit_traced(app, "dup-1")
        assert again == run_id
        assert worker._handoff.reserved == 0
        assert worker.stats.claimed == 1
    kinds = [e["kind"] for e in app.get_run(run_id).timeline]
    assert kinds.count("lease.claimed") == 1, kinds


def test_a_duplicate_submit_hands_over_the_oldest_queued_run(make_app: AppFactory) -> None:
    """A run queued while the worker was away is what the next admission's claim takes, even
    when that admission created nothing: the worker's slot is not wasted on the duplicate."""
    app = make_app()
    app.workflow("chain")(chain)
    first = app.submit("chain", job_id="dup-old", input={"n": 0})["run_id"]
    with running(app) as worker:
        # The claim loop may take the queued run first; either way it runs exactly once.
        app.submit("chain", job_id="dup-old", input={"n": 0})
        wait_until(lambda: app.get_run(first).status == "completed", 10, "the queued run")
        assert worker._handoff.reserved == 0
        assert worker.stats.claimed == 1
    kinds = [e["kind"] for e in app.get_run(first).timeline]
    assert kinds.count("lease.claimed") == 1, kinds


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
        rt = app.aio.runtime
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
            return (await app.aio.submit("chain", job_id="stop-1", input={"n": 0})).run_id
        finally:
            rt.remove_taker(handoff)

    run_id = app.aio.runtime.portal.call(go())
    assert started == []
    assert handoff.reserved == 0
    run = app.get_run(run_id)
    assert run.status == "queued"
    kinds = [e["kind"] for e in run.timeline]
    assert kinds[:2] == ["admitted", "lease.claimed"], kinds
    assert kinds[-1] == "status.queued", kinds


def gate() -> StateGraph:
    def review(state: State) -> dict[str, Any]:
        keel.approval("lead", payload={}, timeout="1h")
        return {"n": 1}

    g = StateGraph(State)
    g.add_node("review", review)
    g.add_edge(START, "review")
    g.add_edge("review", END)
    return g


def test_a_decision_beside_an_idle_worker_hands_it_the_run_it_queued(
    make_app: AppFactory,
) -> None:
    """The decision and the claim that resumes its run: one transaction, committed once (on
    PostgreSQL one round trip); the run resumes without a claim of its own."""
    app = make_app()
    app.workflow("gate")(gate)
    with running(app) as worker:
        run_id = app.submit("gate", job_id="decided-1", input={"n": 0})["run_id"]
        wait_until(lambda: app.get_run(run_id).status == "waiting", 10, "the run to wait")
        wait_until(lambda: not worker._tasks, 10, "the worker's slot to free")

        async def approve() -> list[tuple[list[str], int]]:
            async with traced(app) as trace:
                assert (await app.aio.approve(run_id, by="lead")).recorded
            return [(t.statements, t.round_trips) for t in trace.transactions]

        transactions = app.aio.runtime.portal.call(approve())
        decided = [s for s, _ in transactions if any("keel_waits" in q for q in s)]
        assert len(decided) == 1 and claims(decided[0]), transactions
        if app.aio.runtime.store.dialect == "postgres":
            assert [n for s, n in transactions if s is decided[0]] == [1], transactions
        wait_until(lambda: app.get_run(run_id).status == "completed", 10, "the run to resume")
        assert worker.stats.claimed == 2
    kinds = [e["kind"] for e in app.get_run(run_id).timeline]
    assert kinds.count("lease.claimed") == 2, kinds
    assert app.get_run(run_id).decision == "approved"


def test_a_decision_that_records_nothing_gives_the_slot_back(make_app: AppFactory) -> None:
    """A second decision on a decided wait: the claim beside it takes nothing (the run is
    running or done) and the worker's slot is free again."""
    app = make_app()
    app.workflow("gate")(gate)
    with running(app) as worker:
        run_id = app.submit("gate", job_id="decided-2", input={"n": 0})["run_id"]
        wait_until(lambda: app.get_run(run_id).status == "waiting", 10, "the run to wait")
        assert app.approve(run_id, by="lead").recorded
        wait_until(lambda: app.get_run(run_id).status == "completed", 10, "the run to resume")
        with pytest.raises(keel.RunFinished):
            app.reject(run_id, by="late")
        assert worker._handoff.reserved == 0
        assert worker.stats.claimed == 2
    assert app.get_run(run_id).decision == "approved"


def test_a_hand_off_respects_the_workflows_concurrency_limit(make_app: AppFactory) -> None:
    """The claim that rides on an admission is the worker's claim with its limits: a
    `max_concurrency=1` workflow with a run already running is not handed a second one, even
    with a worker slot free; that run waits, queued, until the first ends."""
    app = make_app()
    release = threading.Event()
    held = held_graph(release)
    app.workflow("held", max_concurrency=1)(held)
    try:
        with running(app, concurrency=2) as worker:
            first = app.submit("held", job_id="limited-1", input={"n": 0})["run_id"]
            wait_until(lambda: app.get_run(first).status == "running", 10, "the first run")

            async def submit_second() -> tuple[str, list[list[str]]]:
                async with traced(app) as trace:
                    run = await app.aio.submit("held", job_id="limited-2", input={"n": 0})
                return run.run_id, [t.statements for t in trace.transactions]

            second, transactions = app.aio.runtime.portal.call(submit_second())
            # The claim was sent with the admission (a slot was free), under the claims' lock
            # that a limit takes, and took nothing.
            assert any("AS locked" in s for s in admission(transactions)), transactions
            assert app.get_run(second).status == "queued"
            assert worker._handoff.reserved == 0
            release.set()
            wait_until(lambda: app.get_run(second).status == "completed", 15, "the second run")
    finally:
        release.set()
    assert worker.stats.claimed == 2


def notified(app: keel.App, act: Callable[[], Any], settle: float = 0.5) -> list[str]:
    """The `keel_wake` payloads sent while `act` runs, heard on a connection of our own."""
    import psycopg

    url = app.aio.runtime.connector.url  # type: ignore[attr-defined]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN keel_wake")
        act()
        return [n.payload for n in conn.notifies(timeout=settle, stop_after=None)]


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_run_handed_to_a_worker_here_wakes_no_other_worker(make_app: AppFactory) -> None:
    """Taken in its own admission's message, the run is not announced: a NOTIFY would send
    every listening worker of the fleet to claim what is already taken. A run the hand-off
    could not take (the worker busy) is announced as before."""
    app = make_app()
    app.workflow("chain")(chain)
    release = threading.Event()
    app.workflow("held")(held_graph(release))
    try:
        with running(app, concurrency=1) as worker:
            taken: list[str] = []
            heard = notified(
                app,
                lambda: taken.append(
                    app.submit("chain", job_id="quiet-1", input={"n": 0})["run_id"]
                ),
            )
            assert taken[0] not in heard, heard
            wait_until(lambda: app.get_run(taken[0]).status == "completed", 10, "the run")
            wait_until(lambda: not worker._tasks, 10, "the slot to free")
            first = app.submit("held", job_id="quiet-2", input={"n": 0})["run_id"]
            wait_until(lambda: app.get_run(first).status == "running", 10, "the held run")
            queued: list[str] = []
            heard = notified(
                app,
                lambda: queued.append(
                    app.submit("chain", job_id="quiet-3", input={"n": 0})["run_id"]
                ),
            )
            assert queued[0] in heard, heard
            release.set()
            wait_until(lambda: app.get_run(queued[0]).status == "completed", 10, "the queued run")
    finally:
        release.set()
