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
from langgraph.types import Command, Send, interrupt
from langgraph_sdk.errors import BadRequestError, ConflictError

import keel
from keel.runtime.snapshot_json import jsonable
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


class Both(TypedDict, total=False):
    answers: Annotated[list[str], operator.add]


def asking_both() -> StateGraph:
    """Two branches of one step, each pausing on its own `interrupt()`."""

    def ask(name: str) -> Callable[[Both], dict[str, Any]]:
        return lambda state: {"answers": [f"{name}={interrupt(name)}"]}

    g = StateGraph(Both)
    g.add_node("left", ask("left"))
    g.add_node("right", ask("right"))
    g.add_edge(START, "left")
    g.add_edge(START, "right")
    g.add_edge("left", END)
    g.add_edge("right", END)
    return g


class Question(TypedDict):
    question: str


class Reply(TypedDict):
    reply: str


class Working(TypedDict, total=False):
    question: str
    scratch: str
    reply: str


def answering() -> StateGraph:
    """Input `question`, output `reply`; `scratch` is the graph's own."""
    g = StateGraph(Working, input_schema=Question, output_schema=Reply)
    g.add_node("think", lambda s: {"scratch": "hmm"})
    g.add_node("respond", lambda s: {"reply": f"R:{s['question']}"})
    g.add_edge(START, "think")
    g.add_edge("think", "respond")
    g.add_edge("respond", END)
    return g


@pytest.fixture
def svc(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    app = make_app(lease_ttl=5)
    app.workflow("routed")(routed)
    app.workflow("both")(asking_both)
    app.workflow("answering")(answering)
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


def test_a_resume_keyed_by_interrupt_ids_answers_each_as_langgraph_does(svc: Served) -> None:
    """`command.resume` as `{interrupt_id: value}` answers each pending interrupt with its own
    value (both at once, or one, then the other), as LangGraph reads it; the JS SDK's headless
    tools mark it `keyedByInterruptId`. A key that is no pending interrupt's is refused."""
    client = svc.client
    oracle = asking_both().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "o"}}
    oracle.invoke({}, config)
    ids = {i.value: i.id for i in oracle.get_state(config).interrupts}
    expected = jsonable(
        oracle.invoke(Command(resume={ids["left"]: "L", ids["right"]: "R"}), config)
    )

    thread = client.threads.create()["thread_id"]
    client.runs.wait(thread, "both", input={})
    pending = {i["value"]: i["id"] for i in client.threads.get_state(thread)["interrupts"]}
    assert set(pending) == {"left", "right"}
    unknown = {"0" * 32: "x"}
    with pytest.raises(ConflictError) as refused:
        client.runs.create(thread, "both", command={"resume": unknown})
    assert f"no interrupt {'0' * 32}" in str(refused.value.body)
    got = client.runs.wait(
        thread,
        "both",
        command={
            "resume": {pending["left"]: "L", pending["right"]: "R"},
            "keyedByInterruptId": True,
        },  # type: ignore[typeddict-unknown-key]
    )
    assert got == expected
    assert sorted(got["answers"]) == ["left=L", "right=R"]

    one_by_one = client.threads.create()["thread_id"]
    client.runs.wait(one_by_one, "both", input={})
    first = {i["value"]: i["id"] for i in client.threads.get_state(one_by_one)["interrupts"]}
    client.runs.wait(one_by_one, "both", command={"resume": {first["left"]: "L"}})
    left = client.threads.get_state(one_by_one)
    assert [i["value"] for i in left["interrupts"]] == ["right"]
    done = client.runs.wait(one_by_one, "both", command={"resume": {first["right"]: "R"}})
    assert sorted(done["answers"]) == ["left=L", "right=R"]
    with pytest.raises(BadRequestError, match="keyedByInterruptId"):
        client.runs.create(thread, "both", command={"resume": "plain", "keyedByInterruptId": True})  # type: ignore[typeddict-unknown-key]


def test_a_graph_with_an_output_schema_shows_its_output_keys_alone(svc: Served) -> None:
    """`wait` answers what LangGraph's `invoke` returns; a stream's values carry the output keys
    (sent when they changed) and a node's updates its writes to them (LangGraph's server's
    answer); the input and private keys stay on the server."""
    client = svc.client
    oracle = answering().compile(checkpointer=InMemorySaver())
    expected = oracle.invoke({"question": "q"}, {"configurable": {"thread_id": "o"}})
    assert expected == {"reply": "R:q"}
    assert client.runs.wait(None, "answering", input={"question": "q"}) == expected
    thread = client.threads.create()["thread_id"]
    streamed = [
        (part.event, part.data)
        for part in client.runs.stream(
            thread, "answering", input={"question": "q"}, stream_mode=["values", "updates"]
        )
        if part.event in ("values", "updates")
    ]
    assert streamed == [
        ("updates", {"think": None}),
        ("updates", {"respond": {"reply": "R:q"}}),
        ("values", {"reply": "R:q"}),
    ]
    # The thread's state is the whole state, as on LangGraph's server.
    assert client.threads.get_state(thread)["values"]["scratch"] == "hmm"
