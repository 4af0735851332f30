"""The stream modes a run's worker captures live (`messages-tuple`, `messages`, `custom`,
`tasks`, `checkpoints`, `debug`) and subgraph namespaces, driven only through langgraph-sdk
against a real uvicorn server and a real worker, on both backends; compared with what
LangGraph's own `graph.stream` yields for the same graph and input."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph, add_messages

from keel.runtime.snapshot_json import jsonable
from tests.interfaces.test_agent_server_runs import (  # the same server and worker
    Served,
    live_worker,
    new_thread,
    parts,
    served,
)

__all__ = ["served"]
REPLY = "the quick brown fox jumps"


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]


def talking() -> StateGraph:
    """One node whose chat model streams its reply token by token."""

    def model(state: Chat) -> dict[str, Any]:
        llm = GenericFakeChatModel(messages=iter([AIMessage(REPLY)]))
        return {"messages": [llm.invoke(state["messages"])]}

    g = StateGraph(Chat)
    g.add_node("model", model)
    g.add_edge(START, "model")
    g.add_edge("model", END)
    return g


class Log(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def nested() -> StateGraph:
    """outer (a subgraph: inner writes custom data) -> after (custom data too)."""

    def inner(state: Log) -> dict[str, Any]:
        write = get_stream_writer()
        for n in range(3):
            write({"inner": n})
        return {"log": ["inner"]}

    def after(state: Log) -> dict[str, Any]:
        get_stream_writer()({"after": True})
        return {"log": ["after"]}

    sub = StateGraph(Log)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    g = StateGraph(Log)
    g.add_node("outer", sub.compile())
    g.add_node("after", after)
    g.add_edge(START, "outer")
    g.add_edge("outer", "after")
    g.add_edge("after", END)
    return g


def talking_inside() -> StateGraph:
    """A node that is `talking`'s graph: an agent as a node (a supervisor's)."""
    g = StateGraph(Chat)
    g.add_node("agent", talking().compile())
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g


@pytest.fixture
def live(served: Served) -> Iterator[Served]:
    served.app.workflow("talk")(talking)
    served.app.workflow("talk_inside")(talking_inside)
    served.app.workflow("nested")(nested)
    with live_worker(served.app):
        yield served


def langgraph_stream(factory: Any, given: Any, modes: list[str], subgraphs: bool) -> list[Any]:
    """What LangGraph's own `stream` yields: (namespace, mode, data)."""
    graph = factory().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    chunks = graph.stream(given, config, stream_mode=modes, subgraphs=subgraphs)
    return [
        (ns, mode, jsonable(data))
        for ns, mode, data in (chunk if subgraphs else ((), *chunk) for chunk in chunks)
    ]


@pytest.mark.parametrize("subgraphs", [False, True])
def test_a_subgraphs_model_streams_messages_as_in_langgraph(live: Served, subgraphs: bool) -> None:
    """Without `stream_subgraphs`, LangGraph sends the subgraph's reply as one finished message
    when its node ends; Keel captured with subgraphs and then dropped the subgraph's tokens,
    sending nothing (a chat UI never showed the reply)."""
    streamed = parts(
        live.client.runs.stream(
            new_thread(live),
            "talk_inside",
            input={"messages": [{"role": "user", "content": "hi"}]},
            stream_mode="messages-tuple",
            stream_subgraphs=subgraphs,
        )
    )
    ours = [(p.event, p.data[0]["content"]) for p in streamed if p.event.startswith("messages")]
    theirs = [
        ("messages" + (f"|{'|'.join(ns)}" if ns else ""), data[0]["content"])
        for ns, _, data in langgraph_stream(
            talking_inside, {"messages": [("user", "hi")]}, ["messages"], subgraphs
        )
    ]
    assert [content for _, content in ours] == [content for _, content in theirs]
    assert "".join(content for _, content in ours).endswith(REPLY) and ours
    assert [e.split("|")[0] for e, _ in ours] == [e.split("|")[0] for e, _ in theirs]


def test_messages_tuple_streams_each_token_with_its_metadata(live: Served) -> None:
    thread = new_thread(live)
    streamed = parts(
        live.client.runs.stream(
            thread,
            "talk",
            input={"messages": [{"role": "user", "content": "hi"}]},
            stream_mode=["messages-tuple", "values"],
        )
    )
    tokens = [p.data for p in streamed if p.event == "messages"]
    expected = [
        d
        for _, m, d in langgraph_stream(
            talking, {"messages": [("user", "hi")]}, ["messages"], False
        )
    ]
    assert len(tokens) == len(expected) == len(REPLY.split()) * 2 - 1  # words and spaces
    assert "".join(message["content"] for message, _ in tokens) == REPLY
    for (message, metadata), (their_message, their_metadata) in zip(tokens, expected, strict=True):
        assert message["type"] == their_message["type"] == "AIMessageChunk"
        assert message["content"] == their_message["content"]
        assert metadata["langgraph_node"] == their_metadata["langgraph_node"] == "model"
        assert metadata["langgraph_step"] == their_metadata["langgraph_step"]
        # As langgraph dev: the run and its thread.
        assert (metadata["run_id"], metadata["thread_id"]) == (streamed[0].data["run_id"], thread)
    # agent-chat-ui reads the reply from `values` too: the whole message, at the end.
    values = [p.data for p in streamed if p.event == "values"]
    assert values[-1]["messages"][-1]["content"] == REPLY
    ids = [p.id for p in streamed]
    assert len(ids) == len(set(ids))
    # Every token comes before the `values` of its step's checkpoint.
    assert max(i for i, p in enumerate(streamed) if p.event == "messages") < len(streamed) - 2

    # `messages`: the metadata once, then the message so far.
    whole = parts(
        live.client.runs.stream(
            new_thread(live),
            "talk",
            input={"messages": [{"role": "user", "content": "hi"}]},
            stream_mode="messages",
        )
    )
    events = [p.event for p in whole]
    assert events.count("messages/metadata") == 1
    partial = [p.data for p in whole if p.event == "messages/partial"]
    assert len(partial) == len(tokens) and partial[-1][0]["content"] == REPLY
    # As langgraph-api: the message so far, not a chunk (`ai`, no chunk fields).
    assert {m[0]["type"] for m in partial} == {"ai"}
    assert not {"tool_call_chunks", "chunk_position"} & {k for m in partial for k in m[0]}


def test_custom_and_subgraph_namespaces_as_langgraph_streams_them(live: Served) -> None:
    client = live.client
    modes = ["custom", "updates"]
    streamed = parts(
        client.runs.stream(
            new_thread(live), "nested", input={"log": []}, stream_mode=modes, stream_subgraphs=True
        )
    )
    ours = [(p.event, p.data) for p in streamed if p.event not in ("metadata", "end")]
    theirs = langgraph_stream(nested, {"log": []}, modes, True)
    names = [mode + "".join(f"|{part.split(':')[0]}" for part in ns) for ns, mode, _ in theirs]
    assert [(e.split(":")[0] if "|" in e else e) for e, _ in ours] == names
    assert [d for _, d in ours] == [d for _, _, d in theirs]
    # The namespace is the subgraph's task: `outer:<task id>`, as LangGraph names it.
    sub = [e for e, _ in ours if "|" in e]
    assert sub and all(e.startswith(("custom|outer:", "updates|outer:")) for e in sub)

    # Without stream_subgraphs: the graph's own, as LangGraph.
    flat = parts(
        client.runs.stream(new_thread(live), "nested", input={"log": []}, stream_mode=modes)
    )
    assert [(p.event, p.data) for p in flat if p.event not in ("metadata", "end")] == [
        (mode, data) for _, mode, data in langgraph_stream(nested, {"log": []}, modes, False)
    ]
    assert [p.data for p in flat if p.event == "custom"] == [{"after": True}]
    assert all("|" not in p.event for p in flat)


@pytest.mark.parametrize("mode", ["tasks", "checkpoints", "debug"])
def test_tasks_checkpoints_and_debug_carry_langgraphs_payloads(live: Served, mode: str) -> None:
    streamed = parts(
        live.client.runs.stream(new_thread(live), "nested", input={"log": []}, stream_mode=mode)
    )
    ours = [p.data for p in streamed if p.event == mode]
    theirs = [d for _, _, d in langgraph_stream(nested, {"log": []}, [mode], False)]
    assert len(ours) == len(theirs) > 0
    # Every field LangGraph sends (a task's also carries Keel's run metadata).
    assert all(set(t) <= set(o) for o, t in zip(ours, theirs, strict=True))
    if mode == "tasks":
        assert [(d["name"], "result" in d) for d in ours] == [
            (d["name"], "result" in d) for d in theirs
        ]
    if mode == "checkpoints":
        assert [d["values"] for d in ours] == [d["values"] for d in theirs]
        assert [d["next"] for d in ours] == [d["next"] for d in theirs]
    if mode == "debug":
        assert [(d["type"], d["step"]) for d in ours] == [(d["type"], d["step"]) for d in theirs]
        # As LangGraph's server sends them: a checkpoint's references beside its configs.
        saved = [d["payload"] for d in ours if d["type"] == "checkpoint"]
        assert saved and saved[0]["parent_checkpoint"] is None
        for payload in saved:
            ids = payload["config"]["configurable"]
            assert payload["checkpoint"] == {
                "checkpoint_id": ids["checkpoint_id"],
                "thread_id": ids["thread_id"],
                "checkpoint_ns": ids["checkpoint_ns"],
            }
        assert [p["parent_checkpoint"]["checkpoint_id"] for p in saved[1:]] == [
            p["checkpoint"]["checkpoint_id"] for p in saved[:-1]
        ]


def test_events_streams_langchains_callback_events_as_astream_events_v2(live: Served) -> None:
    streamed = parts(
        live.client.runs.stream(
            new_thread(live),
            "talk",
            input={"messages": [{"role": "user", "content": "hi"}]},
            stream_mode=["events", "values"],
        )
    )
    ours = [p.data for p in streamed if p.event == "events"]
    graph = talking().compile(checkpointer=InMemorySaver())
    # langgraph-api names the root after the graph id (LangGraph alone: "LangGraph").
    config: Any = {"configurable": {"thread_id": "t"}, "run_name": "talk"}

    async def theirs_of() -> list[dict[str, Any]]:
        given = {"messages": [("user", "hi")]}
        return [jsonable(e) async for e in graph.astream_events(given, config, version="v2")]

    import asyncio

    # The root graph's `on_chain_stream` carries the other modes' chunks: no event of its own.
    theirs = [
        e
        for e in asyncio.run(theirs_of())
        if not (e["event"] == "on_chain_stream" and e["parent_ids"] == [])
    ]
    # The same events, in order, named as LangGraph's own astream_events names them.
    assert [(e["event"], e["name"]) for e in ours] == [(e["event"], e["name"]) for e in theirs]
    assert {k for e in ours for k in e} >= {"event", "name", "run_id", "data", "metadata"}
    tokens = [e["data"]["chunk"]["content"] for e in ours if e["event"] == "on_chat_model_stream"]
    assert "".join(tokens) == REPLY
    assert ours[0]["event"] == "on_chain_start" and ours[-1]["event"] == "on_chain_end"
    # The graph still ran to its end, its values streamed from its checkpoints.
    values = [p.data for p in streamed if p.event == "values"]
    assert values[-1]["messages"][-1]["content"] == REPLY
