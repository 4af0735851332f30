"""The Agent Server protocol's assistants, threads, state and history, driven only through
langgraph-sdk against a real uvicorn server on 127.0.0.1, on both backends.

Runs are submitted with `keel.App` and executed by a worker in this process (the protocol's
runs endpoints are tested on their own). The shapes are compared with what `langgraph dev`
(langgraph-api 0.16.7, the Agent Server's reference implementation) answered to the same
requests on the same graphs: its field names (`ORACLE_*`), and whole bodies where no id or
timestamp is in them (the drawn graphs, the schemas, the empty state).
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, get_args

import pytest
from fastapi import FastAPI
from langgraph.graph import END, START, StateGraph
from langgraph_sdk import get_client, get_sync_client, schema
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    UnprocessableEntityError,
)
from typing_extensions import TypedDict

import keel
from keel.core.errors import UsageError
from keel.runtime.worker import Worker
from keel.service.agent_server import agent_server_router
from keel.service.auth import Authenticator, load_tokens
from keel.service.errors import install
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, READER, TOKENS
from tests.support.thread_graphs import register
from tests.support.workers import drain

# -- what langgraph dev answered (ids and timestamps aside) ----------------------------------

ORACLE_ASSISTANT = {
    "assistant_id",
    "graph_id",
    "config",
    "context",
    "metadata",
    "name",
    "created_at",
    "updated_at",
    "version",
    "description",
}
ORACLE_THREAD = {
    "thread_id",
    "created_at",
    "updated_at",
    "state_updated_at",
    "metadata",
    "status",
    "config",
    "values",
    "error",
    "interrupts",
}
ORACLE_STATE = {
    "values",
    "next",
    "tasks",
    "metadata",
    "created_at",
    "checkpoint",
    "parent_checkpoint",
    "interrupts",
    "checkpoint_id",
    "parent_checkpoint_id",
}
ORACLE_TASK = {"id", "name", "path", "error", "interrupts", "checkpoint", "state", "result"}
ORACLE_CHECKPOINT = {"thread_id", "checkpoint_ns", "checkpoint_id"}
ORACLE_EMPTY_STATE = {
    "values": {},
    "next": [],
    "tasks": [],
    "metadata": None,
    "created_at": None,
    "checkpoint": None,
    "parent_checkpoint": None,
    "interrupts": [],
    "checkpoint_id": None,
    "parent_checkpoint_id": None,
}


def drawn(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, Any]:
    """A graph as the Agent Server draws it."""
    return {
        "nodes": [
            {"id": n} if n == "__end__" else {"id": n, "type": "runnable", "data": {"name": n}}
            for n in nodes
        ],
        "edges": [{"source": s, "target": t} for s, t in edges],
    }


ORACLE_ASK_GRAPH = drawn(
    ["__start__", "ask", "done", "__end__"],
    [("__start__", "ask"), ("ask", "done"), ("done", "__end__")],
)
ORACLE_NESTED_GRAPH = drawn(
    ["__start__", "prepare", "inner", "__end__"],
    [("__start__", "prepare"), ("prepare", "inner"), ("inner", "__end__")],
)
ORACLE_NESTED_XRAY = drawn(
    ["__start__", "prepare", "__end__", "inner:shout"],
    [("__start__", "prepare"), ("prepare", "inner:shout"), ("inner:shout", "__end__")],
)
ORACLE_CHAT_STATE_SCHEMA = {
    "properties": {
        "messages": {"default": None, "items": {}, "title": "Messages", "type": "array"},
        "turns": {"default": None, "title": "Turns", "type": "integer"},
    },
    "title": "chat_state",
    "type": "object",
}
_TEXT = {"title": "Text", "type": "string"}
_STEPS = {"items": {"type": "string"}, "title": "Steps", "type": "array"}
_CTX = {
    "properties": {"user": {"title": "User", "type": "string"}},
    "required": ["user"],
    "title": "Ctx",
    "type": "object",
}
ORACLE_NESTED_SCHEMAS = {
    "graph_id": "nested",
    "input_schema": {
        "properties": {"text": _TEXT},
        "required": ["text"],
        "title": "OuterIn",
        "type": "object",
    },
    "output_schema": {
        "properties": {"text": _TEXT, "steps": _STEPS},
        "title": "Outer",
        "type": "object",
    },
    "state_schema": {
        "properties": {"text": {"default": None, **_TEXT}, "steps": {"default": None, **_STEPS}},
        "title": "nested_state",
        "type": "object",
    },
    "config_schema": _CTX,
    "context_schema": _CTX,
}
ORACLE_NESTED_SUBGRAPHS = {
    "inner": {
        "input_schema": {
            "properties": {"text": _TEXT, "steps": _STEPS},
            "title": "Inner",
            "type": "object",
        },
        "output_schema": {
            "properties": {"text": _TEXT, "steps": _STEPS},
            "title": "Inner",
            "type": "object",
        },
        "state_schema": {
            "properties": {
                "text": {"default": None, **_TEXT},
                "steps": {"default": None, **_STEPS},
            },
            "title": "LangGraphState",
            "type": "object",
        },
        "config_schema": {},
        "context_schema": None,
    }
}

# -- a graph with a subgraph, an input schema and a context schema ---------------------------


class Inner(TypedDict, total=False):
    text: str
    steps: Annotated[list[str], operator.add]


class Outer(TypedDict, total=False):
    text: str
    steps: Annotated[list[str], operator.add]


class OuterIn(TypedDict):
    text: str


class Ctx(TypedDict):
    user: str


def nested() -> StateGraph:
    def shout(state: Inner) -> dict[str, Any]:
        return {"text": state["text"].upper(), "steps": ["shout"]}

    inner = StateGraph(Inner)
    inner.add_node("shout", shout)
    inner.add_edge(START, "shout")
    inner.add_edge("shout", END)

    def prepare(state: Outer) -> dict[str, Any]:
        return {"steps": ["prepare"]}

    g = StateGraph(Outer, context_schema=Ctx, input_schema=OuterIn)
    g.add_node("prepare", prepare)
    g.add_node("inner", inner.compile())
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "inner")
    g.add_edge("inner", END)
    return g


# -- fixtures --------------------------------------------------------------------------------


class Served:
    def __init__(self, app: keel.App, url: str) -> None:
        self.app = app
        self.url = url
        self.client: SyncLangGraphClient = get_sync_client(url=url, api_key=ADMIN)


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    """An App with the thread graphs (`chat`, `ask`, `review`) and `nested`, behind a server
    answering only the Agent Server protocol, with Keel's tokens."""
    app = register(make_app(lease_ttl=5))
    app.workflow("nested")(nested)
    api = FastAPI()
    install(api)
    api.include_router(agent_server_router(app, Authenticator(load_tokens(TOKENS))))
    with LiveServer(api) as server:
        here = Served(app, server.url)
        yield here
        here.client.http.client.close()


@contextmanager
def live_worker(app: keel.App) -> Iterator[None]:
    """A worker executing runs as they come, for requests that wait on one."""
    worker = Worker(app.aio.runtime, concurrency=2)
    loop = app.aio.runtime.portal.loop
    done = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(worker.stop)
        done.result(timeout=30)


def say(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def contents(values: dict[str, Any]) -> list[str]:
    return [m["content"] for m in values["messages"]]


def default_id(graph_id: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"keel://assistants/{graph_id}"))


# -- info and assistants ---------------------------------------------------------------------


def test_ok_and_info(served: Served) -> None:
    http = served.client.http
    assert http.get("/ok") == {"ok": True}
    info = http.get("/info")
    assert info["flags"]["assistants"] is True and info["flags"]["crons"] is False
    assert info["version"] == info["keel"]["version"]


def test_a_default_assistant_per_workflow(served: Served) -> None:
    c = served.client
    found = c.assistants.search(limit=10)
    assert [a["graph_id"] for a in found] == ["ask", "chat", "nested", "review"]
    for a in found:
        assert set(a) == ORACLE_ASSISTANT
        assert a["assistant_id"] == default_id(a["graph_id"])
        assert (a["name"], a["version"], a["config"]) == (a["graph_id"], 1, {})
        assert a["metadata"]["created_by"] == "system"
        # The graph id is accepted wherever an assistant id is (agent-chat-ui sends it).
        assert c.assistants.get(a["assistant_id"]) == c.assistants.get(a["graph_id"]) == a
    assert c.assistants.count() == 4
    assert c.assistants.count(graph_id="chat") == 1
    assert [a["graph_id"] for a in c.assistants.search(graph_id="ask")] == ["ask"]
    assert c.assistants.search(metadata={"created_by": "someone"}) == []
    page = c.assistants.search(limit=3, offset=0, response_format="object")
    assert [a["graph_id"] for a in page["assistants"]] == ["ask", "chat", "nested"]
    assert page["next"] == "3"
    last = c.assistants.search(limit=3, offset=3, response_format="object")
    assert ([a["graph_id"] for a in last["assistants"]], last["next"]) == (["review"], None)
    assert c.assistants.search(select=["assistant_id"], limit=1) == [
        {"assistant_id": default_id("ask")}
    ]
    versions = c.assistants.get_versions("chat")
    assert [v["version"] for v in versions] == [1]
    assert set(versions[0]) == ORACLE_ASSISTANT - {"updated_at"}

    with pytest.raises(NotFoundError):
        c.assistants.get("no-such-graph")
    with pytest.raises(NotFoundError):
        c.assistants.get(str(uuid.uuid4()))
    with pytest.raises(ConflictError) as refused:
        c.assistants.delete(default_id("chat"))
    assert refused.value.status_code == 409
    assert c.assistants.count() == 4


def test_graphs_schemas_and_subgraphs_as_langgraph_dev_draws_them(served: Served) -> None:
    c = served.client
    assert c.assistants.get_graph("ask") == ORACLE_ASK_GRAPH
    assert c.assistants.get_graph(default_id("nested")) == ORACLE_NESTED_GRAPH
    assert c.assistants.get_graph("nested", xray=True) == ORACLE_NESTED_XRAY
    assert c.assistants.get_schemas("nested") == ORACLE_NESTED_SCHEMAS
    assert c.assistants.get_subgraphs("nested") == ORACLE_NESTED_SUBGRAPHS
    assert c.assistants.get_subgraphs("nested", namespace="inner") == ORACLE_NESTED_SUBGRAPHS
    assert c.assistants.get_subgraphs("nested", namespace="elsewhere") == {}
    assert c.assistants.get_subgraphs("chat") == {}
    chat = c.assistants.get_schemas("chat")
    assert chat["state_schema"] == ORACLE_CHAT_STATE_SCHEMA
    assert (chat["graph_id"], chat["config_schema"], chat["context_schema"]) == ("chat", {}, None)
    # A `typing.TypedDict` state on Python 3.11, which pydantic cannot describe as LangGraph
    # asks it to: described from the graph's channels instead of left null.
    assert set(chat["input_schema"]["properties"]) == {"messages", "turns"}


# -- threads ---------------------------------------------------------------------------------


def test_a_thread_made_before_its_first_run(served: Served) -> None:
    c, app = served.client, served.app
    made = c.threads.create(metadata={"user": "ada"})
    tid = made["thread_id"]
    assert set(made) == ORACLE_THREAD
    assert (made["status"], made["values"], made["interrupts"]) == ("idle", None, {})
    assert made["metadata"] == {"user": "ada"}  # no graph yet
    assert c.threads.get_state(tid) == ORACLE_EMPTY_STATE
    assert c.threads.get_history(tid) == []
    with pytest.raises(BadRequestError, match="no graph"):
        c.threads.update_state(tid, {"turns": 1})

    # Its first run gives it its workflow; the thread reads as the Agent Server's after a run.
    app.submit("chat", say("hi"), thread_id=tid)
    drain(app)
    thread = c.threads.get(tid)
    assert set(thread) == ORACLE_THREAD
    assert thread["metadata"] == {
        "user": "ada",
        "graph_id": "chat",
        "assistant_id": default_id("chat"),
    }
    assert (thread["status"], thread["error"], thread["interrupts"]) == ("idle", None, {})
    assert contents(thread["values"]) == ["hi", "echo: hi"]
    assert thread["created_at"] == made["created_at"]
    assert thread["created_at"].endswith("+00:00") and "T" in thread["created_at"]
    with pytest.raises(UsageError, match="belongs to workflow 'chat'"):
        app.submit("ask", {"question": "q?"}, thread_id=tid)  # one thread, one graph

    # A thread made with its graph belongs to it at once; ids are kept; if_exists decides.
    named = c.threads.create(thread_id="named-1", graph_id="ask", metadata={"k": 1})
    assert named["metadata"] == {"k": 1, "graph_id": "ask", "assistant_id": default_id("ask")}
    with pytest.raises(ConflictError):
        c.threads.create(thread_id="named-1")
    again = c.threads.create(thread_id="named-1", if_exists="do_nothing")
    assert again["metadata"] == named["metadata"]
    with pytest.raises(BadRequestError):
        c.threads.create(thread_id="not a valid id!")
    with pytest.raises(NotFoundError):
        c.threads.get("no-such-thread")


def test_its_first_protocol_run_gives_a_thread_its_graph(served: Served) -> None:
    c = served.client
    tid = c.threads.create(metadata={"user": "ada"})["thread_id"]
    with live_worker(served.app):
        out = c.runs.wait(tid, default_id("ask"), input={"question": "color?"})
        assert [i["value"] for i in out["__interrupt__"]] == [{"question": "color?"}]
        assert c.threads.get(tid)["metadata"]["graph_id"] == "ask"
        assert c.threads.get(tid)["status"] == "interrupted"
        with pytest.raises(BadRequestError, match="belongs to workflow 'ask'"):
            c.runs.create(tid, "chat", input=say("hi"))  # one thread, one graph
        assert c.runs.wait(tid, "ask", command={"resume": "blue"})["answer"] == "blue"
    assert c.threads.get_state(tid)["values"]["log"] == ["asked color?", "done"]


def test_state_history_and_checkpoints_of_a_conversation(served: Served) -> None:
    c, app = served.client, served.app
    tid = c.threads.create(graph_id="chat")["thread_id"]
    for text in ("hi", "bye"):
        app.submit("chat", say(text), thread_id=tid)
        drain(app)
    state = c.threads.get_state(tid)
    assert set(state) == ORACLE_STATE
    assert set(state["checkpoint"]) == ORACLE_CHECKPOINT
    assert contents(state["values"]) == ["hi", "echo: hi", "bye", "echo: bye"]
    assert state["next"] == [] and state["tasks"] == [] and state["interrupts"] == []
    assert state["checkpoint"] == {
        "thread_id": tid,
        "checkpoint_ns": "",
        "checkpoint_id": state["checkpoint_id"],
    }
    assert state["created_at"].endswith("+00:00")

    history = c.threads.get_history(tid, limit=100)
    assert history[0] == state
    # Per run: its input, the step that takes it in, the reply.
    assert [h["metadata"]["source"] for h in history] == ["loop", "loop", "input"] * 2
    for older, newer in zip(history[1:], history, strict=False):
        assert newer["parent_checkpoint_id"] == older["checkpoint_id"]
    pending = history[1]  # the second run's, before its reply: what the reply wrote, as is
    assert pending["next"] == ["reply"]
    (task,) = pending["tasks"]
    assert set(task) == ORACLE_TASK
    assert (task["name"], task["path"], task["error"], task["interrupts"]) == (
        "reply",
        ["__pregel_pull", "reply"],
        None,
        [],
    )
    assert task["result"] == {"messages": [["ai", "echo: bye"]], "turns": 1}
    assert (task["checkpoint"], task["state"]) == (None, None)

    # A past checkpoint, by id and as a Checkpoint; pages of history; the metadata filter.
    past = history[2]["checkpoint_id"]
    assert c.threads.get_state(tid, checkpoint_id=past) == history[2]
    at = {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": past, "checkpoint_map": None}
    assert c.threads.get_state(tid, checkpoint=at) == history[2]
    with pytest.raises(NotFoundError):
        c.threads.get_state(tid, checkpoint_id="1f000000-0000-6000-8000-000000000000")
    assert c.threads.get_history(tid, limit=2) == history[:2]
    assert c.threads.get_history(tid, before=history[1]["checkpoint_id"]) == history[2:]
    before = {"configurable": {"checkpoint_id": history[1]["checkpoint_id"]}}
    assert c.threads.get_history(tid, before=before, limit=1) == history[2:3]  # type: ignore[arg-type]
    assert c.threads.get_history(tid, checkpoint=at) == [history[2]]
    inputs = c.threads.get_history(tid, limit=100, metadata={"source": "input"})
    assert [h["checkpoint_id"] for h in inputs] == [
        h["checkpoint_id"] for h in history if h["metadata"]["source"] == "input"
    ]
    assert len(inputs) == 2
    assert c.threads.get_history(tid, limit=1, metadata={"source": "input"}) == inputs[:1]
    selected = c.threads.get_state(tid, select=["values", "next"])
    assert selected == {"values": state["values"], "next": []}
    # `values.<key>`, as the SDKs document it: that key of the state alone.
    (key, value), *_ = state["values"].items()
    one = c.threads.get_state(tid, select=[f"values.{key}", "next"])
    assert one == {"values": {key: value}, "next": []}
    newest = c.threads.get_history(tid, limit=1, select=[f"values.{key}", "next"])
    assert newest == [{"values": {key: history[0]["values"][key]}, "next": history[0]["next"]}]
    # A field a state does not have is refused, as langgraph-api refuses one in a search: an
    # empty answer read as an empty state. A key `values` lacks is just not there.
    for asked in (
        lambda: c.threads.get_state(tid, select=["valuse"]),
        lambda: c.threads.get_history(tid, select=["valuse.turns"]),
    ):
        with pytest.raises(UnprocessableEntityError) as refused:
            asked()
        assert "valuse" in refused.value.body["message"]  # type: ignore[index]
    assert c.threads.get_state(tid, select=["values.nope"]) == {"values": {}}


def test_update_state_answers_the_checkpoint_a_worker_wrote(served: Served) -> None:
    c, app = served.client, served.app
    tid = c.threads.create(graph_id="chat")["thread_id"]
    app.submit("chat", say("hi"), thread_id=tid)
    drain(app)
    with live_worker(app):
        updated = c.threads.update_state(tid, {"turns": 10}, as_node="reply")
    assert set(updated) == {"checkpoint", "configurable", "checkpoint_id"}
    assert set(updated["checkpoint"]) == ORACLE_CHECKPOINT
    checkpoint_id = updated["checkpoint"]["checkpoint_id"]
    ref = {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    assert updated == {"checkpoint": ref, "configurable": ref, "checkpoint_id": checkpoint_id}
    state = c.threads.get_state(tid)
    assert state["checkpoint_id"] == checkpoint_id
    assert state["values"]["turns"] == 11  # through the `turns` reducer, as node `reply`
    assert state["metadata"]["source"] == "update"
    updates = c.threads.get_history(tid, metadata={"source": "update"})
    assert [h["checkpoint_id"] for h in updates] == [checkpoint_id]
    with pytest.raises(BadRequestError, match="as_node"):
        c.threads.update_state(tid, {"turns": 1}, as_node="nowhere")
    assert c.threads.get_state(tid)["checkpoint_id"] == checkpoint_id  # nothing admitted


def test_an_interrupted_thread(served: Served) -> None:
    c, app = served.client, served.app
    tid = c.threads.create()["thread_id"]
    app.submit("ask", {"question": "color?"}, thread_id=tid)
    drain(app)
    thread = c.threads.get(tid)
    assert thread["status"] == "interrupted"
    state = c.threads.get_state(tid)
    assert state["next"] == ["ask"]
    (task,) = state["tasks"]
    assert set(task) == ORACLE_TASK
    assert [i["value"] for i in task["interrupts"]] == [{"question": "color?"}]
    assert set(task["interrupts"][0]) == {"value", "id"}
    assert thread["interrupts"] == {task["id"]: task["interrupts"]}
    assert state["interrupts"] == task["interrupts"]
    assert [t["thread_id"] for t in c.threads.search(status="interrupted")] == [tid]
    # Keel keeps a thread whose run is unfinished: cancel the run first.
    with pytest.raises(ConflictError):
        c.threads.delete(tid)
    app.resume(tid, "blue")
    drain(app)
    assert c.threads.get(tid)["status"] == "idle"
    assert c.threads.get_state(tid)["values"]["answer"] == "blue"
    c.threads.delete(tid)
    with pytest.raises(NotFoundError):
        c.threads.get(tid)


def test_search_count_update_copy_and_delete(served: Served) -> None:
    c, app = served.client, served.app
    ids = {}
    for name, graph, text in (("a", "chat", "one"), ("b", "chat", "two"), ("c", "ask", None)):
        ids[name] = c.threads.create(thread_id=f"t-{name}", metadata={"team": "x", "n": name})[
            "thread_id"
        ]
        app.submit(
            graph,
            say(text) if text else {"question": "q?"},
            thread_id=ids[name],
        )
        drain(app)
    c.threads.create(thread_id="t-empty", metadata={"team": "y"})
    # Keel's own runs, not made through the protocol, are found by graph and assistant too.
    app.submit("chat", say("own"), thread_id="t-own")
    drain(app)

    def found(**query: Any) -> list[str]:
        return [t["thread_id"] for t in c.threads.search(limit=100, **query)]

    assert sorted(found(metadata={"team": "x"})) == ["t-a", "t-b", "t-c"]
    assert sorted(found(metadata={"graph_id": "chat"})) == ["t-a", "t-b", "t-own"]
    assert sorted(found(metadata={"assistant_id": default_id("ask")})) == ["t-c"]
    assert found(metadata={"graph_id": "chat", "assistant_id": default_id("ask")}) == []
    assert sorted(found(status="interrupted")) == ["t-c"]
    assert found(values={"messages": [{"content": "two"}]}) == ["t-b"]
    assert found(values={"turns": 1}, metadata={"team": "x"}, sort_by="thread_id") == [
        "t-b",
        "t-a",
    ]
    assert found(ids=["t-c", "t-a", "missing"], sort_by="thread_id", sort_order="asc") == [
        "t-a",
        "t-c",
    ]
    assert found(sort_by="thread_id", sort_order="asc")[:3] == ["t-a", "t-b", "t-c"]
    newest_first = found()
    assert newest_first[0] == "t-own" and len(newest_first) == 5
    assert c.threads.search(limit=2, offset=1) == c.threads.search(limit=100)[1:3]
    assert c.threads.search(ids=["t-a"], select=["thread_id", "status"]) == [
        {"thread_id": "t-a", "status": "idle"}
    ]
    with pytest.raises(UnprocessableEntityError):
        c.threads.search(ids=["t-a"], select=["thread_id", "nope"])  # type: ignore[list-item]
    assert c.threads.count() == 5
    assert c.threads.count(metadata={"team": "x"}) == 3
    assert c.threads.count(status="interrupted") == 1
    assert c.threads.count(values={"turns": 1}) == 3
    for thread in c.threads.search(limit=100):
        assert set(thread) == ORACLE_THREAD

    updated = c.threads.update("t-a", metadata={"n": "A", "extra": True})
    assert updated["metadata"]["n"] == "A" and updated["metadata"]["team"] == "x"
    assert c.threads.get("t-a")["metadata"]["extra"] is True
    assert c.threads.update("t-a", metadata={"m": 1}, return_minimal=True) is None

    copied = c.threads.copy("t-a")
    assert copied["thread_id"] != "t-a"
    assert copied["values"] == c.threads.get("t-a")["values"]
    assert copied["metadata"]["team"] == "x"
    assert c.threads.get_history(copied["thread_id"], limit=100) != []

    c.threads.delete("t-b")
    with pytest.raises(NotFoundError):
        c.threads.get("t-b")
    with pytest.raises(NotFoundError):
        c.threads.delete("t-b")
    assert c.threads.count(metadata={"team": "x"}) == 3  # t-a, its copy, t-c


# -- auth and the async client ---------------------------------------------------------------


def test_an_unknown_select_field_is_refused_on_an_empty_page_too(served: Served) -> None:
    # Checked against the endpoint's fields, not its rows: a misspelled field is a 422 whether
    # or not anything matched, and every field a row shows may be asked of an empty page.
    c = served.client
    tid = c.threads.create()["thread_id"]  # no graph: no runs, no history, no crons
    empty: dict[str, Callable[[list[Any]], Any]] = {
        "threads": lambda s: c.threads.search(ids=["missing"], select=s),
        "assistants": lambda s: c.assistants.search(graph_id="missing", select=s),
        "crons": lambda s: c.crons.search(thread_id=tid, select=s),
        "runs": lambda s: c.runs.list(tid, select=s),
        "history": lambda s: c.threads.get_history(tid, select=s),
    }
    every = {
        "threads": ORACLE_THREAD,
        "assistants": ORACLE_ASSISTANT,
        "crons": {"cron_id", "schedule", "next_run_date", "enabled"},
        "runs": {"run_id", "status", "kwargs", "multitask_strategy"},
        "history": set(ORACLE_STATE) | {"values.turns"},
    }
    # And every field the SDK's own `select` literals offer, whether or not Keel shows it.
    offered = {
        "threads": schema.ThreadSelectField,
        "assistants": schema.AssistantSelectField,
        "crons": schema.CronSelectField,
        "runs": schema.RunSelectField,
    }
    for name, literal in offered.items():
        every[name] |= set(get_args(literal))
    for name, listed in empty.items():
        assert listed(sorted(every[name])) == [], name
        with pytest.raises(UnprocessableEntityError) as refused:
            listed(["nope"])
        assert "nope" in refused.value.body["message"], name  # type: ignore[index]
    # On a page with rows too: a field the SDK offers that Keel does not show is left out.
    assert c.threads.search(ids=[tid], select=["thread_id", "context"]) == [{"thread_id": tid}]


def test_tokens_as_the_sdk_sends_them(served: Served) -> None:
    reader = get_sync_client(url=served.url, api_key=READER)
    assert reader.assistants.count() == 4
    with pytest.raises(PermissionDeniedError):
        reader.threads.create()
    nobody = get_sync_client(url=served.url, api_key=None)
    with pytest.raises(AuthenticationError):
        nobody.threads.search()
    wrong = get_sync_client(url=served.url, api_key="wrong-" + ADMIN)
    with pytest.raises(AuthenticationError):
        wrong.assistants.search()
    bearer = get_sync_client(
        url=served.url, api_key=None, headers={"Authorization": f"Bearer {ADMIN}"}
    )
    assert bearer.threads.create(thread_id="by-bearer")["thread_id"] == "by-bearer"
    assert nobody.http.get("/ok") == {"ok": True}  # as /healthz: no token needed
    for client in (reader, nobody, wrong, bearer):
        client.http.client.close()


def test_the_async_client(served: Served) -> None:
    app = served.app

    async def drive() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        client = get_client(url=served.url, api_key=ADMIN)
        try:
            thread = await client.threads.create(graph_id="chat")
            await asyncio.to_thread(app.submit, "chat", say("hi"), thread_id=thread["thread_id"])
            await asyncio.to_thread(drain, app)
            got = await client.threads.get(thread["thread_id"])
            state = await client.threads.get_state(thread["thread_id"])
            assistants = await client.assistants.search()
            return got, state, assistants
        finally:
            await client.http.client.aclose()

    got, state, assistants = asyncio.run(drive())
    assert contents(got["values"]) == contents(state["values"]) == ["hi", "echo: hi"]
    assert len(assistants) == 4


def test_prune_deletes_the_threads_with_no_unfinished_run(served: Served) -> None:
    c, app = served.client, served.app
    idle, busy, kept = (c.threads.create(graph_id="chat")["thread_id"] for _ in range(3))
    app.submit("chat", say("hi"), thread_id=idle)
    drain(app)
    app.submit("chat", say("hi"), thread_id=busy)  # queued: no worker takes it here
    missing = str(uuid.uuid4())
    assert c.threads.prune([idle, busy, missing, idle]) == {"pruned_count": 1}
    with pytest.raises(NotFoundError):
        c.threads.get(idle)
    assert {c.threads.get(t)["status"] for t in (busy, kept)} == {"busy", "idle"}
    with pytest.raises(UnprocessableEntityError) as refused:
        c.threads.prune([kept], strategy="keep_latest")
    assert "keep_latest" in refused.value.body["message"]  # type: ignore[index]
    assert c.threads.get(kept)["thread_id"] == kept
