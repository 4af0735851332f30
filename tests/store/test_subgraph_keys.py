"""Idempotency keys: distinct for every logical call, the same on every replay.

Subgraphs are where a key can lose its place: a compiled subgraph used as a node restarts
its own step count at every invocation, so the subgraph's node, step and task path are the
same for each parallel branch (Send) and each loop iteration of the parent.
"""

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


class SubState(TypedDict, total=False):
    to: str
    results: Annotated[list[Any], operator.add]


class SubOutput(TypedDict, total=False):
    results: Annotated[list[Any], operator.add]


class ParentState(TypedDict, total=False):
    to: str
    copies: int
    rounds: int
    done: int
    results: Annotated[list[Any], operator.add]


def notify_effect(provider: Provider) -> Any:
    def notify(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, {"to": to})

    return keel.effect("notify")(notify)


def subgraph(notify: Any) -> Any:
    def inner(state: SubState) -> dict[str, Any]:
        return {"results": [notify(state["to"])]}

    g = StateGraph(SubState, output_schema=SubOutput)
    g.add_node("inner", inner)
    g.add_edge(START, "inner")
    g.add_edge("inner", END)
    return g.compile()


def fanout_into_subgraph(notify: Any) -> StateGraph:
    """`copies` parallel Sends into one subgraph node, all with the same arguments."""

    def plan(state: ParentState) -> dict[str, Any]:
        return {}

    def branches(state: ParentState) -> list[Send]:
        return [Send("sub", {"to": state["to"]}) for _ in range(state["copies"])]

    g = StateGraph(ParentState)
    g.add_node("plan", plan)
    g.add_node("sub", subgraph(notify))
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", branches, ["sub"])
    g.add_edge("sub", END)
    return g


def loop_over_subgraph(notify: Any) -> StateGraph:
    """The parent runs the same subgraph `rounds` times in a loop (a revision loop)."""

    def count(state: ParentState) -> dict[str, Any]:
        return {"done": state.get("done", 0) + 1}

    def again(state: ParentState) -> str:
        return "sub" if state["done"] < state["rounds"] else END

    g = StateGraph(ParentState)
    g.add_node("sub", subgraph(notify))
    g.add_node("count", count)
    g.add_edge(START, "sub")
    g.add_edge("sub", "count")
    g.add_conditional_edges("count", again, ["sub", END])
    return g


def test_parallel_sends_into_a_subgraph_perform_each_branch_once(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("fan-sub")(lambda: fanout_into_subgraph(notify_effect(provider)))
    run = app.submit("fan-sub", job_id="fan-1", input={"to": "a@x", "copies": 3})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(details.output["results"]) == 3
    # Three branches asked for three notifications: the world must have seen three.
    assert len(provider.deliveries) == 3
    assert len({e["idempotency_key"] for e in details.effects}) == 3


def test_loop_iterations_through_a_subgraph_perform_each_iteration_once(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("loop-sub")(lambda: loop_over_subgraph(notify_effect(provider)))
    run = app.submit("loop-sub", job_id="loop-1", input={"to": "a@x", "rounds": 2})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.deliveries) == 2
    assert len(set(provider.deliveries)) == 2


def test_approval_inside_a_subgraph_resumes_and_its_effect_runs_once(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    notify = notify_effect(provider)

    def inner(state: SubState) -> dict[str, Any]:
        before = notify(state["to"])  # replayed on resume: served from the ledger
        decision = keel.approval("manager", payload={"to": state["to"]}, timeout="1h")
        return {"results": [before["id"], decision.decision]}

    def build() -> StateGraph:
        sub = StateGraph(SubState, output_schema=SubOutput)
        sub.add_node("inner", inner)
        sub.add_edge(START, "inner")
        sub.add_edge("inner", END)
        g = StateGraph(ParentState)
        g.add_node("sub", sub.compile())
        g.add_edge(START, "sub")
        g.add_edge("sub", END)
        return g

    app = make_app()
    app.workflow("sub-approval")(build)
    run = app.submit("sub-approval", job_id="sub-a-1", input={"to": "a@x"})["run_id"]
    drain(app)
    assert app.get_run(run).status == "waiting"
    assert app.approve(run, by="alice").recorded
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert details.output["results"] == ["p-1", "approved"]
    assert len(provider.deliveries) == 1
