"""Fencing inside one process: a stale execution of a run writes nothing after a takeover,
even when the new owner lives in the same process (the same worker re-claimed the run after
its own lease expired, e.g. while its event loop was blocked past the TTL)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.core import leases
from keel.core.context import current

AppFactory = Callable[..., keel.App]


class WhoState(TypedDict, total=False):
    who: str


def test_stale_execution_in_the_same_process_cannot_write_checkpoints(
    make_app: AppFactory,
) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=30)
    rt = app.aio
    inside: dict[int, asyncio.Event] = {}
    go: dict[int, asyncio.Event] = {}

    async def work(state: WhoState) -> dict[str, Any]:
        token = current().token
        inside[token].set()
        await go[token].wait()
        return {"who": "stale" if token == 1 else "fresh"}

    def build() -> StateGraph:
        g = StateGraph(WhoState)
        g.add_node("work", work)
        g.add_edge(START, "work")
        g.add_edge("work", END)
        return g

    app.workflow("who")(build)
    run = app.submit("who", job_id="who-1", input={"who": ""})["run_id"]

    async def scenario() -> tuple[str, str, list[Any]]:
        for token in (1, 2):
            inside[token], go[token] = asyncio.Event(), asyncio.Event()

        async def start(worker: str) -> asyncio.Task[str]:
            # PostgreSQL skips a row a checkpoint write holds (SKIP LOCKED): poll, as workers do.
            for _ in range(500):
                got = await leases.claim(rt.store, worker, rt.workflows.keys(), clock.now(), 30)
                if got is not None:
                    return asyncio.create_task(rt.executor(worker).execute(*got))
                await asyncio.sleep(0.01)
            raise AssertionError("nothing to claim")

        first = await start("worker-a")
        await inside[1].wait()
        clock.advance(31)  # worker-a's loop was blocked past its lease...
        second = await start("worker-b")  # ...and this process re-claimed the run
        await inside[2].wait()
        go[1].set()  # the stale execution finishes its step
        stale = await first
        go[2].set()
        fresh = await second
        config = {"configurable": {"thread_id": run}}
        history = [c.checkpoint["channel_values"].get("who") async for c in rt.saver.alist(config)]
        return stale, fresh, history

    stale, fresh, history = rt.portal.call(scenario())
    assert (stale, fresh) == ("lease_lost", "completed")
    assert app.get_run(run).output == {"who": "fresh"}
    # Token 1 lost the run before its node returned: none of its state may be checkpointed.
    assert "stale" not in history, f"a stale execution wrote checkpoints: {history}"
