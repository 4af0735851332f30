"""Effects inside LangGraph's ToolNode: an AI message's tool calls run at once, so the order in
which they reach an effect changes between executions; their effects are numbered per tool
call (its id is in the checkpointed message), the same on every execution.

Each test runs three tool calls (sync tools on threads, async tools as tasks) that each send an
email after a random pause, and counts what the provider received. Before the tool-call keys a
resume refused most of these runs as changed, and sent some emails twice.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any, TypedDict
from uuid import uuid4

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

import keel
from keel.core.ids import StepRef
from keel.langgraph.tool_calls import scope_of
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]
ROUNDS = 6
"""Runs per test: a wrong key scheme fails nearly every one of them (a 1-in-6 order at best)."""


class State(TypedDict, total=False):
    tag: str
    messages: Annotated[list[Any], add_messages]


def tools_for(provider: Provider, kind: str) -> tuple[BaseTool, BaseTool]:
    """`notify(to)` and `notify_and_confirm(to)` (which then pauses), as sync or async tools,
    each pausing up to 20 ms first so the calls' order varies."""

    def deliver(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(to)
        return provider.deliver(idempotency_key, to)

    if kind == "sync":
        send = keel.effect("send_email")(deliver)

        @tool
        def notify(to: str) -> str:
            """Email `to`."""
            time.sleep(random.uniform(0, 0.02))
            send(to)
            return f"sent {to}"

        @tool
        def notify_and_confirm(to: str) -> str:
            """Email `to`, then ask a person."""
            time.sleep(random.uniform(0, 0.02))
            send(to)
            return f"sent {to}, {interrupt(f'confirm {to}?')}"

        return notify, notify_and_confirm

    async def adeliver(to: str, *, idempotency_key: str) -> Any:
        return deliver(to, idempotency_key=idempotency_key)

    asend = keel.effect("send_email")(adeliver)

    @tool
    async def anotify(to: str) -> str:
        """Email `to`."""
        await asyncio.sleep(random.uniform(0, 0.02))
        await asend(to)
        return f"sent {to}"

    @tool
    async def anotify_and_confirm(to: str) -> str:
        """Email `to`, then ask a person."""
        await asyncio.sleep(random.uniform(0, 0.02))
        await asend(to)
        return f"sent {to}, {interrupt(f'confirm {to}?')}"

    return anotify, anotify_and_confirm


def model_then_tools(model: Callable[[State], State], tools: ToolNode) -> StateGraph:
    """START -> `model` (a fake chat model) -> `tools` (a ToolNode) -> END."""
    g = StateGraph(State)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_edge("model", "tools")
    g.add_edge("tools", END)
    return g


def one_node(node: Callable[[State], State]) -> StateGraph:
    """START -> `node` -> END."""
    g = StateGraph(State)
    g.add_node("node", node)
    g.add_edge(START, "node")
    g.add_edge("node", END)
    return g


def agent_graph(provider: Provider, kind: str, *, pause: bool, calls: int = 3) -> StateGraph:
    """A fake model that asks for `calls` tool calls at once (fixed ids), then a ToolNode; the
    last call pauses after its email when `pause`."""
    plain, confirm = tools_for(provider, kind)

    def model(state: State) -> State:
        names = [plain.name] * (calls - 1) + [(confirm if pause else plain).name]
        asked = [
            {"name": name, "args": {"to": f"{state['tag']}-{n}"}, "id": f"call_{n}"}
            for n, name in enumerate(names)
        ]
        return {"messages": [AIMessage(content="", tool_calls=asked, id="ai-1")]}

    return model_then_tools(model, ToolNode([plain, confirm]))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_parallel_tool_calls_resumed_after_a_pause_send_each_email_once(
    make_app: AppFactory, kind: str
) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("agent")(lambda: agent_graph(provider, kind, pause=True))
    tags = [f"r{i}" for i in range(ROUNDS)]
    runs = [app.submit("agent", {"tag": tag}, thread_id=f"t-{tag}").run_id for tag in tags]
    drain(app)
    assert {app.get_run(r).status for r in runs} == {"waiting"}
    for tag in tags:
        app.resume(f"t-{tag}", "yes")  # LangGraph runs the whole ToolNode task again
    drain(app)
    details = [app.get_run(r) for r in runs]
    assert [(d.status, d.run["error"]) for d in details] == [("completed", None)] * ROUNDS
    assert Counter(provider.calls) == Counter(f"{tag}-{n}" for tag in tags for n in range(3))
    assert len(provider.deliveries) == 3 * ROUNDS
    for d in details:
        assert sorted(e["status"] for e in d.effects) == ["sent"] * 3


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_replay_of_parallel_tool_calls_serves_each_from_its_own_row(
    make_app: AppFactory, kind: str
) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("agent")(lambda: agent_graph(provider, kind, pause=False))
    runs = [app.submit("agent", {"tag": f"r{i}"}, job_id=f"j-{i}").run_id for i in range(ROUNDS)]
    drain(app)
    assert {app.get_run(r).status for r in runs} == {"completed"}
    for run_id in runs:
        report = app.replay(run_id)
        # Each effect finds its own row; and the ToolNode's messages, which LangGraph gives
        # new ids on every execution, are not taken for other values written.
        assert report.effects_served == 3, report.model_dump()
        assert not report.diverged, report.model_dump()
    assert len(provider.deliveries) == 3 * ROUNDS  # the replays sent nothing


def test_a_run_started_before_tool_call_keys_keeps_its_keys_across_a_resume(
    make_app: AppFactory, db_url: str
) -> None:
    """A run whose first execution was a worker of the release before 0032 (`effect_keys` 1)
    recorded its effects under keys numbered per task: a resume by this release must find them
    there, not send again. One tool call, so that numbering is the same on both executions."""
    provider = Provider()
    app = make_app()
    app.workflow("agent")(lambda: agent_graph(provider, "sync", pause=True, calls=1))
    old = app.submit("agent", {"tag": "old"}, thread_id="t-old").run_id
    new = app.submit("agent", {"tag": "new"}, thread_id="t-new").run_id
    _started_by_an_older_worker(db_url, old)
    drain(app)
    asked = scope_of({"name": "notify_and_confirm", "args": {"to": "new-0"}, "id": "call_0"})
    suffixes = {old: "call:0", new: f"tool:{asked}:call:0"}
    for run_id, suffix in suffixes.items():
        assert app.get_run(run_id).run["effect_keys"] == (1 if run_id == old else 2)
        [row] = app.get_run(run_id).effects
        place = StepRef(run_id, "tools", int(row["step"]), str(row["task_path"]), "tools")
        assert row["idempotency_key"] == place.key("effect", "send_email", suffix)
    app.resume("t-old", "yes")
    app.resume("t-new", "yes")
    drain(app)
    assert [app.get_run(r).status for r in (old, new)] == ["completed", "completed"]
    assert sorted(provider.calls) == ["new-0", "old-0"]


def _started_by_an_older_worker(db_url: str, run_id: str) -> None:
    """The run as a worker of the release before 0032 leaves it: started, its keys per task."""
    sql = "UPDATE keel_runs SET effect_keys = 1, started_at = created_at WHERE run_id = "
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.execute(sql + "?", (run_id,))
        return
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql + "%s", (run_id,))


def test_after_a_call_refused_as_changed_its_task_performs_nothing_more(
    make_app: AppFactory,
) -> None:
    """A sibling tool (or a node that catches the error) goes on calling effects after its task
    diverged: those calls are refused too, not performed under numbers no call had before."""
    provider = Provider()
    refused: list[str] = []

    @keel.effect("send_email")
    def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(to)
        return provider.deliver(idempotency_key, to)

    def node(state: State) -> State:
        first = "a" if not provider.calls else "b"  # another recipient when run again
        try:
            send(first)
        except keel.NondeterminismError as exc:
            refused.append(exc.key)
        if refused:
            send("c")  # the task diverged: refused, never sent
        return {"tag": interrupt("send more?")}

    app = make_app()
    app.workflow("mailer")(lambda: one_node(node))
    run_id = app.submit("mailer", {"tag": "t"}, thread_id="t-1").run_id
    drain(app)
    app.resume("t-1", "yes")
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "failed"
    assert details.run["error"].startswith("NondeterminismError"), details.run["error"]
    assert len(refused) == 1 and refused[0] in details.run["error"]
    assert provider.calls == ["a"]


def _paused_then_resumed(app: keel.App, runs: int = ROUNDS) -> list[Any]:
    """Submit `runs` runs of "agent" on threads of their own, run them to their pause, answer
    it, run them to the end; their details."""
    ids = [app.submit("agent", {"tag": f"r{i}"}, thread_id=f"t-{i}").run_id for i in range(runs)]
    drain(app)
    assert {app.get_run(r).status for r in ids} == {"waiting"}
    for i in range(runs):
        app.resume(f"t-{i}", "yes")
    drain(app)
    return [app.get_run(r) for r in ids]


def test_tool_calls_a_node_runs_itself_with_new_ids_each_time_keep_the_tasks_order(
    make_app: AppFactory,
) -> None:
    """The LangChain docs' loop: a node asks the model and invokes each tool call itself. The
    model's ids are new on every execution (nothing checkpointed them), so they cannot name the
    calls: these are numbered in the node's own order, the same on the resume."""
    provider = Provider()
    plain, _ = tools_for(provider, "sync")

    def node(state: State) -> State:
        for n in range(3):  # a model answering anew: other ids every time
            plain.invoke(
                {"name": plain.name, "args": {"to": f"{state['tag']}-{n}"}, "id": str(uuid4())}
                | {"type": "tool_call"}
            )
        return {"tag": interrupt("more?")}

    app = make_app()
    app.workflow("agent")(lambda: one_node(node))
    details = _paused_then_resumed(app)
    assert [d.status for d in details] == ["completed"] * ROUNDS
    assert len(provider.deliveries) == 3 * ROUNDS
    assert Counter(provider.calls) == Counter(f"r{i}-{n}" for i in range(ROUNDS) for n in range(3))


@pytest.mark.parametrize("ids", ["same", "empty"])
def test_tool_calls_sharing_an_id_or_without_one_are_told_apart_by_what_they_ask(
    make_app: AppFactory, ids: str
) -> None:
    provider = Provider()
    plain, confirm = tools_for(provider, "sync")

    def model(state: State) -> State:
        names = [plain.name, plain.name, confirm.name]
        same = "call" if ids == "same" else ""
        asked = [
            {"name": name, "args": {"to": f"{state['tag']}-{n}"}, "id": same}
            for n, name in enumerate(names)
        ]
        return {"messages": [AIMessage(content="", tool_calls=asked, id="ai-1")]}

    app = make_app()
    app.workflow("agent")(lambda: model_then_tools(model, ToolNode([plain, confirm])))
    details = _paused_then_resumed(app)
    assert [(d.status, d.run["error"]) for d in details] == [("completed", None)] * ROUNDS
    assert len(provider.deliveries) == 3 * ROUNDS


def test_a_tool_call_refused_as_changed_leaves_its_sibling_tool_calls_served(
    make_app: AppFactory,
) -> None:
    """ToolNode(handle_tool_errors=True) turns the refusal into an error message for the model;
    the sibling tool calls, unchanged, are served from the ledger, not refused (and so never
    asked again and sent twice)."""
    provider = Provider()
    plain, confirm = tools_for(provider, "sync")
    drafts: Counter[str] = Counter()

    @keel.effect("send_email")
    def send_draft(to: str, body: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, (to, body))

    @tool
    def redraft(to: str) -> str:
        """Email `to` a text written anew each time."""
        drafts[to] += 1
        send_draft(to, f"draft {drafts[to]}")
        return "sent"

    def model(state: State) -> State:
        asked = [
            {"name": "redraft", "args": {"to": "x"}, "id": "call_0"},
            {"name": plain.name, "args": {"to": f"{state['tag']}-1"}, "id": "call_1"},
            {"name": confirm.name, "args": {"to": f"{state['tag']}-2"}, "id": "call_2"},
        ]
        return {"messages": [AIMessage(content="", tool_calls=asked, id="ai-1")]}

    tools = ToolNode([redraft, plain, confirm], handle_tool_errors=True)
    app = make_app()
    app.workflow("agent")(lambda: model_then_tools(model, tools))
    [details] = _paused_then_resumed(app, runs=1)
    assert details.status == "completed", details.run["error"]
    assert Counter(provider.calls) == Counter({"r0-1": 1, "r0-2": 1})  # siblings: once each
    assert len(provider.deliveries) == 3  # and the redraft's first text only
    messages = details.output["messages"]
    assert "NondeterminismError" in str(messages[1])  # the redraft's answer to the model
    assert ["NondeterminismError" in str(m) for m in messages[2:]] == [False, False]


def test_a_tool_invoking_another_tool_with_a_fixed_id_keeps_its_own_tool_calls_order(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    plain, confirm = tools_for(provider, "sync")

    @tool
    def delegate(to: str) -> str:
        """Have `notify` email `to`."""
        time.sleep(random.uniform(0, 0.02))
        return str(
            plain.invoke(
                {"name": plain.name, "args": {"to": to}, "id": "inner"} | {"type": "tool_call"}
            ).content
        )

    def model(state: State) -> State:
        asked = [
            {"name": "delegate", "args": {"to": f"{state['tag']}-{n}"}, "id": f"call_{n}"}
            for n in range(2)
        ] + [{"name": confirm.name, "args": {"to": f"{state['tag']}-2"}, "id": "call_2"}]
        return {"messages": [AIMessage(content="", tool_calls=asked, id="ai-1")]}

    app = make_app()
    app.workflow("agent")(lambda: model_then_tools(model, ToolNode([delegate, confirm])))
    details = _paused_then_resumed(app)
    assert [(d.status, d.run["error"]) for d in details] == [("completed", None)] * ROUNDS
    assert len(provider.deliveries) == 3 * ROUNDS
