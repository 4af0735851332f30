"""A worker's life in one process: stopping one worker must not poison the next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.runtime.worker import Worker
from tests.review.parts import drain

AppFactory = Callable[..., keel.App]


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
    first = Worker(app.aio, stop_when_idle=False)
    loop = app.aio.portal.loop
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
