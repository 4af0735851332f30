"""The worker loop: draining a queue with bounded concurrency, re-claiming its own runs, and a
worker's life in one process (stopping one worker must not poison the next)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.runtime.worker import Worker
from tests.support.graphs import echo_graph, pay_graph
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def test_worker_drains_20_queued_runs_with_concurrency_4(make_app: AppFactory) -> None:
    both = threading.Condition()
    inflight = [0]
    peak = [0]

    def slow(state: dict[str, Any]) -> dict[str, Any]:
        with both:
            inflight[0] += 1
            peak[0] = max(peak[0], inflight[0])
            both.notify_all()
            # The first run waits (bounded) for a second one to be executing beside it.
            both.wait_for(lambda: peak[0] >= 2, timeout=5)
        time.sleep(0.01)
        with both:
            inflight[0] -= 1
        return {"out": state["text"].upper()}

    app = make_app()
    app.workflow("echo")(lambda: echo_graph(slow))  # type: ignore[arg-type]
    runs = [app.submit("echo", job_id=f"job-{i}", input={"text": f"t{i}"}) for i in range(20)]
    stats = app.run_worker(concurrency=4, stop_when_idle=True, handle_signals=False)
    assert (stats.claimed, stats.finished, stats.lost) == (20, 20, 0)
    for i, run in enumerate(runs):
        details = app.get_run(run["run_id"])
        assert details.status == "completed"
        assert details.output["out"] == f"T{i}"
        assert [e["kind"] for e in details.timeline].count("lease.claimed") == 1
    assert 2 <= peak[0] <= 4
    assert app.list_runs(status="queued") == [] and app.list_runs(status="running") == []


def test_worker_with_nothing_queued_stops_when_idle(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    stats = app.run_worker(stop_when_idle=True, handle_signals=False)
    assert (stats.claimed, stats.finished) == (0, 0)


def test_worker_reclaiming_its_own_expired_run_keeps_the_new_lease(make_app: AppFactory) -> None:
    """A worker whose run outlived its lease (a stall) may claim that run again itself.

    The stale execution (token 1) is then fenced out; its clean-up must not drop the hold
    and the bookkeeping of the new execution (token 2) of the same run in the same process,
    or the new execution loses its checkpoint writes (the run sits `running` until its lease
    expires) and the worker stops heartbeating, draining and counting it.
    """
    clock = keel.ManualClock()
    provider = Provider(dedupe=True)
    app = make_app(clock=clock, lease_ttl=30)
    run_id = ""

    async def wait_for(condition: Callable[[], Any], what: str) -> None:
        for _ in range(1000):
            if await condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    async def charge(amount: int, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        if len(provider.calls) == 1:
            clock.advance(app.aio.runtime.lease_ttl + 1)  # stalled past the lease

            async def reclaimed() -> bool:
                run = await app.aio.runtime.store.get_run(run_id)
                return run is not None and run["lease_token"] >= 2

            await wait_for(reclaimed, "the worker to claim its expired run again")
        else:

            async def stale_gone() -> bool:
                return [t.get_name() for t in asyncio.all_tasks()].count(f"keel-run-{run_id}") == 1

            await wait_for(stale_gone, "the stale execution to finish")
            # The worker still tracks (heartbeats, drains, counts) the execution that is live.
            lease, task = worker._tasks[run_id]
            assert lease.token == 2 and not task.done()
        return provider.deliver(idempotency_key, amount)

    effect = keel.effect("charge", provider_idempotent=True)(charge)
    app.workflow("pay")(lambda: pay_graph(effect))
    run_id = app.submit("pay", job_id="order-1", input={"amount": 5})["run_id"]
    worker = Worker(app.aio.runtime, concurrency=4, stop_when_idle=True)
    stats = drain(app, within=15, worker=worker)
    details = app.get_run(run_id)
    assert details.status == "completed"
    assert (stats.claimed, stats.finished, stats.lost) == (2, 1, 1)
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1
    assert len(provider.deliveries) == 1
    assert [e["status"] for e in details.effects] == ["sent"]


# -- one worker after another ----------------------------------------------------------------


class TwoState(TypedDict, total=False):
    n: int


def two_steps() -> StateGraph:
    def one(state: TwoState) -> dict[str, Any]:
        return {"n": state.get("n", 0) + 1}

    def two(state: TwoState) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    g = StateGraph(TwoState)
    g.add_node("one", one)
    g.add_node("two", two)
    g.add_edge(START, "one")
    g.add_edge("one", "two")
    g.add_edge("two", END)
    return g


def test_a_worker_started_after_another_was_stopped_still_finishes_runs(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("two")(two_steps)
    first = Worker(app.aio.runtime, stop_when_idle=False)
    loop = app.aio.runtime.portal.loop
    future = asyncio.run_coroutine_threadsafe(first.run(), loop)
    deadline = time.monotonic() + 10
    while not [w for w in app.workers() if w["worker_id"] == first.worker_id]:
        assert time.monotonic() < deadline, "the first worker never started"
        time.sleep(0.01)
    loop.call_soon_threadsafe(first.stop)  # a graceful stop (SIGTERM)
    future.result(timeout=10)

    run = app.submit("two", job_id="after-stop", input={"n": 0})["run_id"]
    stats = drain(app, within=5)
    details = app.get_run(run)
    assert details.status == "completed"
    assert details.output == {"n": 2}
    # Released at no step boundary: the new worker was not draining.
    assert "status.queued" not in [e["kind"] for e in details.timeline]
    assert stats.claimed == 1


def test_a_worker_that_stopped_heartbeating_is_listed_as_silent_then_dead_not_dropped(
    make_app: AppFactory,
) -> None:
    clock = keel.ManualClock(1_000.0)
    app = make_app(clock=clock, lease_ttl=3)
    app.workflow("two")(two_steps)
    drain(app)  # announces itself, then stops: a stopped worker is never listed
    assert app.workers(silent_for=3600) == []
    worker = Worker(app.aio.runtime)
    app.aio.runtime.portal.call(worker._announce())
    assert [w["state"] for w in app.workers()] == ["live"]
    clock.advance(3.5)  # three heartbeat intervals without a word (cut off, or dead)
    assert app.workers() == []
    assert [(w["worker_id"], w["state"]) for w in app.workers(silent_for=3600)] == [
        (worker.worker_id, "silent")
    ]
    clock.advance(5)  # 8.5 s: still within three lease TTLs (9 s)
    assert [w["state"] for w in app.workers(silent_for=3600)] == ["silent"]
    clock.advance(1)  # past three lease TTLs: its leases lapsed long ago (SIGKILLed, say)
    assert [(w["worker_id"], w["state"]) for w in app.workers(silent_for=3600)] == [
        (worker.worker_id, "dead")
    ]
    assert app.workers(silent_for=5) == []  # `silent_for` still bounds what is listed
    clock.advance(3600)
    assert app.workers(silent_for=3600) == []


def test_a_run_stopped_past_the_grace_is_counted_as_given_back(make_app: AppFactory) -> None:
    started = threading.Event()

    async def slow(state: TwoState) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(60)  # past any grace
        return {"n": 1}

    def slow_graph() -> StateGraph:
        g = StateGraph(TwoState)
        g.add_node("slow", slow)
        g.add_edge(START, "slow")
        g.add_edge("slow", END)
        return g

    app = make_app()
    app.workflow("slow")(slow_graph)
    run_id = app.submit("slow", job_id="slow-1", input={"n": 0}).run_id
    worker = Worker(app.aio.runtime, grace=0.2)
    loop = app.aio.runtime.portal.loop
    future = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    assert started.wait(10), "the node never started"
    loop.call_soon_threadsafe(worker.stop)  # SIGTERM: drain, then cancel past the grace
    stats = future.result(timeout=20)
    assert (stats.claimed, stats.lost, stats.finished) == (1, 1, 0), str(stats)
    assert app.get_run(run_id).status == "queued"  # given back, to resume elsewhere
