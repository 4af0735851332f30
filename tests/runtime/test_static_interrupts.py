"""Static interrupts (`interrupt_before`/`interrupt_after` of a run's submitted options, as the
Agent Server passes them) executed by a real worker, on both backends: the run pauses where
LangGraph's own invocation with the same options pauses, as a wait of kind interrupt with no
payload and no deadline; answering it lets the same run go on to the end LangGraph reaches,
no node running twice.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.lifecycle import Status
from keel.langgraph.static_interrupts import KWARGS
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]
CALLS: list[str] = []


class Log(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def steps() -> StateGraph:
    def node(name: str) -> Callable[[Log], dict[str, Any]]:
        def run(state: Log) -> dict[str, Any]:
            CALLS.append(name)
            return {"log": [name]}

        return run

    g = StateGraph(Log)
    for name in ("a", "b", "c"):
        g.add_node(name, node(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def oracle(options: dict[str, Any]) -> list[tuple[tuple[str, ...], list[str]]]:
    """Where LangGraph's own invocations with `options` pause, and the log there, until done."""
    graph = steps().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "o"}}
    seen = []
    graph_input: Any = {"log": []}
    while True:
        graph.invoke(graph_input, config, **options)
        state = graph.get_state(config)
        seen.append((tuple(state.next), list(state.values["log"])))
        if not state.next:
            return seen
        graph_input = None


@pytest.mark.parametrize(
    "options",
    [{"interrupt_before": ["b"]}, {"interrupt_after": ["a", "b"]}, {"interrupt_before": "*"}],
)
def test_a_run_pauses_where_langgraph_pauses_and_goes_on(
    make_app: AppFactory, options: dict[str, Any]
) -> None:
    app = make_app()
    app.workflow("steps")(steps)
    expected = oracle(options)
    CALLS.clear()
    run_id = app.submit("steps", {"log": []}, thread_id="t", config={KWARGS: options}).run_id
    seen = []
    for _ in expected:
        drain(app)
        state = app.get_state("t")
        seen.append((tuple(state.next), list(state.values["log"])))
        row = app.get_run(run_id)
        if not state.next:
            assert row.run["status"] == Status.COMPLETED
            break
        assert row.run["status"] == Status.WAITING
        assert app.get_thread("t")["status"] == "interrupted"
        pending = [w for w in row.waits if w["status"] == "pending"]
        assert len(pending) == 1
        wait = pending[0]
        assert (wait["kind"], wait["name"]) == ("interrupt", next(iter(options)))
        assert wait["payload"] in (None, "null") and wait["deadline"] is None
        app.resume("t", None)
    assert seen == expected
    assert CALLS == ["a", "b", "c"]  # no node ran twice across the pauses
    assert [r["run_id"] for r in app.thread_runs("t")] == [run_id]  # one run, resumed


def test_a_run_without_static_options_never_pauses(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("steps")(steps)
    run_id = app.submit("steps", {"log": []}, thread_id="t", config={KWARGS: {}}).run_id
    drain(app)
    row = app.get_run(run_id)
    assert row.run["status"] == Status.COMPLETED and row.waits == []


def test_a_graph_compiled_with_its_own_pause_waits_there_instead_of_completing(
    make_app: AppFactory,
) -> None:
    """A factory may return a graph compiled with `interrupt_before` (a langgraph.json project's
    graph often is): LangGraph stops there on every invocation that asks for no pause of its
    own. That is a pause to wait on, not the end of the run; answering it runs the rest."""
    options = {"interrupt_before": ["b"]}
    app = make_app()
    app.workflow("gated")(lambda: steps().compile(**options))
    expected = oracle(options)
    CALLS.clear()
    run_id = app.submit("gated", {"log": []}, thread_id="g").run_id
    drain(app)
    state = app.get_state("g")
    assert (tuple(state.next), list(state.values["log"])) == expected[0]
    assert app.get_run(run_id).status == Status.WAITING, "the run ended at its pause"
    app.resume("g", None)
    drain(app)
    assert app.get_run(run_id).status == Status.COMPLETED
    assert app.get_state("g").values["log"] == expected[-1][1] == ["a", "b", "c"]
    assert CALLS == ["a", "b", "c"], "a node ran twice, or not at all"
