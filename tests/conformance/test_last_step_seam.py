"""Keel holds a run's last checkpoint back for its end when LangGraph will find no task after it
(`keel.langgraph.savers.is_last_step`, LangGraph's own test on the same inputs). Checked here
against LangGraph itself, over graph shapes: never "last" where LangGraph has a task to run
next (the checkpoint would wait while a node ran), and "last" at the end of the usual shapes
(else the end costs a transaction of its own again).
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Send

from keel.langgraph.buffers import TASKS, is_last_step


class S(TypedDict, total=False):
    n: Annotated[int, operator.add]
    seen: Annotated[list[str], operator.add]


class Recording(InMemorySaver):
    def __init__(self) -> None:
        super().__init__()
        self.saved: list[tuple[RunnableConfig, Any, Any]] = []

    async def aput(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new: Any) -> Any:
        self.saved.append((config, checkpoint, metadata))
        return await super().aput(config, checkpoint, metadata, new)


def bump(name: str) -> Callable[[S], dict[str, Any]]:
    def node(state: S) -> dict[str, Any]:
        return {"n": 1, "seen": [name]}

    return node


def chain() -> StateGraph:
    g = StateGraph(S)
    for name in "abc":
        g.add_node(name, bump(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g


def branch() -> StateGraph:
    g = StateGraph(S)
    g.add_node("a", bump("a"))
    g.add_node("b", bump("b"))
    g.add_edge(START, "a")
    g.add_conditional_edges("a", lambda s: "b" if s["n"] < 2 else END)
    g.add_edge("b", END)
    return g


def loop() -> StateGraph:
    g = StateGraph(S)
    g.add_node("a", bump("a"))
    g.add_edge(START, "a")
    g.add_conditional_edges("a", lambda s: "a" if s["n"] < 4 else END)
    return g


def fan_in() -> StateGraph:
    g = StateGraph(S)
    for name in "abcd":
        g.add_node(name, bump(name))
    for name in "abc":
        g.add_edge(START, name)
        g.add_edge(name, "d")
    g.add_edge("d", END)
    return g


def sends() -> StateGraph:
    g = StateGraph(S)
    g.add_node("work", bump("work"))
    g.add_node("reduce", bump("reduce"))
    g.add_conditional_edges(START, lambda s: [Send("work", {"n": i}) for i in range(3)])
    g.add_edge("work", "reduce")
    g.add_edge("reduce", END)
    return g


def sends_to_the_end() -> StateGraph:
    g = StateGraph(S)
    g.add_node("work", bump("work"))
    g.add_node("split", bump("split"))
    g.add_edge(START, "split")
    g.add_conditional_edges("split", lambda s: [Send("work", {"n": i}) for i in range(3)])
    g.add_edge("work", END)
    return g


def command() -> StateGraph:
    def a(state: S) -> Command[Any]:
        return Command(update={"seen": ["a"]}, goto="b" if not state.get("n") else END)

    g = StateGraph(S)
    g.add_node("a", a, destinations=("b", END))
    g.add_node("b", bump("b"))
    g.add_edge(START, "a")
    g.add_edge("b", END)
    return g


def subgraph() -> StateGraph:
    inner = chain().compile()
    g = StateGraph(S)
    g.add_node("pre", bump("pre"))
    g.add_node("inner", inner)
    g.add_edge(START, "pre")
    g.add_edge("pre", "inner")
    g.add_edge("inner", END)
    return g


def deferred() -> StateGraph:
    g = StateGraph(S)
    for name in "ab":
        g.add_node(name, bump(name))
    g.add_node("late", bump("late"), defer=True)
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge("a", "late")
    g.add_edge("b", "late")
    g.add_edge("late", END)
    return g


def silent_end() -> StateGraph:
    g = StateGraph(S)
    g.add_node("a", bump("a"))
    g.add_node("quiet", lambda s: {})
    g.add_edge(START, "a")
    g.add_edge("a", "quiet")
    g.add_edge("quiet", END)
    return g


SHAPES: dict[str, tuple[Callable[[], StateGraph], dict[str, Any], bool]] = {
    # name: (graph, input, whether its last checkpoint must be known as last)
    "chain": (chain, {"n": 0}, True),
    "branch-to-end": (branch, {"n": 5}, True),
    "branch-on": (branch, {"n": 0}, True),
    "loop": (loop, {"n": 0}, True),
    "fan-in": (fan_in, {"n": 0}, True),
    "sends": (sends, {"n": 0}, True),
    "sends-to-the-end": (sends_to_the_end, {"n": 0}, True),
    "command-goto": (command, {"n": 0}, True),
    "command-end": (command, {"n": 1}, True),
    "subgraph": (subgraph, {"n": 0}, True),
    "deferred": (deferred, {"n": 0}, True),
    "silent-end": (silent_end, {"n": 0}, False),  # nothing updated: LangGraph looks at all
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_checkpoint_is_last_only_where_langgraph_runs_nothing_after_it(shape: str) -> None:
    build, given, known = SHAPES[shape]
    saver = Recording()
    graph = build().compile(checkpointer=saver)
    thread = str(uuid.uuid4())
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    asyncio.run(graph.ainvoke(given, config))
    assert graph.get_state(config).next == ()
    triggers = graph.trigger_to_nodes
    assert triggers, "LangGraph's compiled graph no longer says which channels trigger nodes"
    roots = [
        (c, cp)
        for c, cp, meta in saver.saved
        if not c["configurable"].get("checkpoint_ns") and meta.get("source") == "loop"
    ]
    assert roots
    for _, checkpoint in roots:
        at: RunnableConfig = {
            "configurable": {"thread_id": thread, "checkpoint_id": checkpoint["id"]}
        }
        if is_last_step(checkpoint, triggers):
            assert graph.get_state(at).next == (), (shape, checkpoint["updated_channels"])
    last = roots[-1][1]
    assert is_last_step(last, triggers) is known, (shape, last["updated_channels"])


def test_the_send_channel_is_langgraphs() -> None:
    from langgraph._internal import _constants

    assert TASKS == _constants.TASKS
