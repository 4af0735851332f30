"""What the protocol answers for runs that start from a command or from no input, and how a
failure reads, compared with LangGraph's own answer for the same graph (InMemorySaver), through
langgraph-sdk against a real server and worker on both backends.

- A run that runs no node (no input on a finished thread, an `update` alone) answers the
  thread's values, as LangGraph's `invoke` returns them.
- `goto` takes a `Send` as the SDKs write it, `{"node", "input"}`; a target of another shape is
  refused before anything is admitted.
- A failed thread's `error` and a state task's `error` read as LangGraph Platform's do.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send
from langgraph_sdk.errors import BadRequestError

import keel
from keel.runtime.conversations import jsonable
from tests.interfaces.test_agent_server_runs import Served, failing, serving


class Route(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def routed() -> StateGraph:
    """router -> b; a -> b. A `goto` or a `Send` may start it at `a`."""

    def a(state: Any) -> dict[str, Any]:
        given = state.get("log", []) if isinstance(state, dict) else []
        return {"log": ["a", *(f"given {item}" for item in given)]}

    g = StateGraph(Route)
    g.add_node("router", lambda s: {"log": ["router"]})
    g.add_node("a", a)
    g.add_node("b", lambda s: {"log": ["b"]})
    g.add_edge(START, "router")
    g.add_edge("router", "b")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


@pytest.fixture
def svc(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    app = make_app(lease_ttl=5)
    app.workflow("routed")(routed)
    app.workflow("failing")(failing)
    with serving(app) as served:
        yield served


def langgraph_turns(factory: Callable[[], StateGraph], turns: list[Any]) -> list[Any]:
    """What LangGraph's own `invoke` returns for each turn on one thread."""
    graph = factory().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    return [jsonable(graph.invoke(turn, config)) for turn in turns]


def test_a_run_that_runs_no_node_answers_the_threads_values(svc: Served) -> None:
    client = svc.client
    thread = client.threads.create()["thread_id"]
    first = client.runs.wait(thread, "routed", input={"log": ["in"]})
    again = client.runs.wait(thread, "routed", input=None)
    updated = client.runs.wait(thread, "routed", command={"update": {"log": ["u"]}})
    joined = client.runs.create(thread, "routed", command={"update": {"log": ["u2"]}})
    expected = langgraph_turns(
        routed,
        [
            {"log": ["in"]},
            None,
            Command(update={"log": ["u"]}),
            Command(update={"log": ["u2"]}),
        ],
    )
    assert [first, again, updated, client.runs.join(thread, joined["run_id"])] == expected
    assert again == first != {}  # the values, not `{}`


def test_goto_takes_a_send_as_the_sdk_writes_it_and_refuses_other_shapes(svc: Served) -> None:
    client = svc.client
    forms: list[tuple[Any, Any]] = [
        ({"node": "a", "input": {"log": ["sent"]}}, Send("a", {"log": ["sent"]})),
        ([{"node": "a", "input": {"log": ["x"]}}, "b"], [Send("a", {"log": ["x"]}), "b"]),
        ("a", "a"),
    ]
    for wire, sent in forms:
        thread = client.threads.create()["thread_id"]
        got = client.runs.wait(thread, "routed", command={"goto": wire}, raise_error=False)
        assert [got] == langgraph_turns(routed, [Command(goto=sent)]), wire
    thread = client.threads.create()["thread_id"]
    for wrong in ({"node": "a", "extra": 1}, 7, [{"input": {}}]):
        with pytest.raises(BadRequestError) as refused:
            client.runs.create(thread, "routed", command={"goto": wrong})
        assert "command.goto takes node names and sends" in str(refused.value.body)
    assert client.runs.list(thread) == []  # nothing admitted


def test_a_failed_threads_error_and_its_tasks_error_read_as_langgraphs(svc: Served) -> None:
    client = svc.client
    thread = client.threads.create()["thread_id"]
    client.runs.wait(thread, "failing", input={"log": []}, raise_error=False)
    shown = client.threads.get(thread)
    assert (shown["status"], shown["error"]) == (
        "error",
        {"error": "ValueError", "message": "boom"},
    )
    graph = failing().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    with pytest.raises(ValueError):
        graph.invoke({"log": []}, config)
    (task,) = graph.get_state(config).tasks
    (ours,) = client.threads.get_state(thread)["tasks"]
    # LangGraph keeps a task's error as the exception's repr: shown as it is, not quoted again.
    assert (
        (ours["name"], ours["error"]) == (task.name, task.error) == ("boom", "ValueError('boom')")
    )
