"""One SQLite connection, one re-entrant lock, shared by the store, the saver, effects and
heartbeats of every run in the process, from sync nodes (threads, through the portal) and
async nodes alike: a wide mix must finish, not deadlock on the lock or the trampoline."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import keel
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]
BRANCHES = 12
RUNS = 3


class MixState(TypedDict, total=False):
    n: int
    out: Annotated[list[Any], operator.add]


def test_sync_and_async_branches_with_effects_and_heartbeats_all_finish(
    make_app: AppFactory,
) -> None:
    provider = Provider()

    @keel.effect("sync_note")
    def sync_note(i: int, *, idempotency_key: str) -> Any:
        keel.heartbeat({"in_effect": i})  # a blocking Keel call from inside a sync effect
        return provider.deliver(idempotency_key, i)

    @keel.effect("async_note")
    async def async_note(i: int, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, i)

    def sync_branch(state: dict[str, int]) -> dict[str, Any]:
        keel.heartbeat({"branch": state["i"]})
        keel.artifacts().write_json(f"sync-{state['i']}.json", state)
        return {"out": [sync_note(state["i"])["payload"]]}

    async def async_branch(state: dict[str, int]) -> dict[str, Any]:
        keel.heartbeat({"branch": state["i"]})
        return {"out": [(await async_note(state["i"]))["payload"]]}

    def fan(state: MixState) -> list[Send]:
        return [
            Send("sync_branch" if i % 2 else "async_branch", {"i": i}) for i in range(state["n"])
        ]

    def build() -> StateGraph:
        g = StateGraph(MixState)
        g.add_node("sync_branch", sync_branch)
        g.add_node("async_branch", async_branch)
        g.add_conditional_edges(START, fan, ["sync_branch", "async_branch"])
        g.add_edge("sync_branch", END)
        g.add_edge("async_branch", END)
        return g

    app = make_app()
    app.workflow("mix")(build)
    runs = [
        app.submit("mix", job_id=f"mix-{k}", input={"n": BRANCHES})["run_id"] for k in range(RUNS)
    ]
    drain(app, concurrency=RUNS, within=30)
    for run in runs:
        details = app.get_run(run)
        assert details.status == "completed", details.run["error"]
        assert sorted(details.output["out"]) == list(range(BRANCHES))
    assert len(provider.deliveries) == BRANCHES * RUNS
    assert len(set(provider.deliveries)) == BRANCHES * RUNS
