"""A thread paused on `interrupt()`, driven through langgraph-sdk as a chat UI drives it: on
LangGraph's server the paused run has returned, so new input runs at once, whatever the
multitask strategy, and nothing of the paused turn is rolled back. Keel answers the same (the
paused run ends `interrupted`, its steps kept), compared with LangGraph's own `invoke` of the
same turns on an InMemorySaver; a run still running keeps the thread busy as before. On both
backends, a real server and worker.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from langgraph_sdk.errors import ConflictError

import keel
from keel.runtime.snapshot_json import jsonable
from tests.interfaces.test_agent_server_runs import GATES, Served, gated, serving, without_ids
from tests.support.checks import wait_until
from tests.support.thread_graphs import reviewing


class Noted(TypedDict, total=False):
    question: str
    answer: Any
    log: Annotated[list[str], operator.add]


def noted() -> StateGraph:
    """note (logs the question) -> ask (interrupt) -> done."""

    def ask(state: Noted) -> dict[str, Any]:
        return {"answer": interrupt({"question": state["question"]}), "log": ["answered"]}

    g = StateGraph(Noted)
    g.add_node("note", lambda s: {"log": [f"noted {s['question']}"]})
    g.add_node("ask", ask)
    g.add_node("done", lambda s: {"log": ["done"]})
    g.add_edge(START, "note")
    g.add_edge("note", "ask")
    g.add_edge("ask", "done")
    g.add_edge("done", END)
    return g


@pytest.fixture
def svc(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    app = make_app(lease_ttl=5)
    app.workflow("noted")(noted)
    app.workflow("gated")(gated)
    app.workflow("review")(reviewing)
    with serving(app) as served:
        yield served


def langgraph_turns(turns: list[Any]) -> list[Any]:
    """What LangGraph's own `invoke` returns for each turn on one thread, interrupt ids aside."""
    graph = noted().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    return [without_ids(jsonable(graph.invoke(turn, config))) for turn in turns]


@pytest.mark.parametrize("strategy", [None, "enqueue", "reject", "interrupt", "rollback"])
def test_new_input_on_a_paused_thread_runs_at_once_and_keeps_the_paused_turn(
    svc: Served, strategy: str | None
) -> None:
    client = svc.client
    thread = client.threads.create()["thread_id"]
    options = {"multitask_strategy": strategy} if strategy else {}
    paused = client.runs.wait(thread, "noted", input={"question": "a"})
    (first,) = client.runs.list(thread)
    again = client.runs.wait(thread, "noted", input={"question": "b"}, **options)
    done = client.runs.wait(thread, "noted", command={"resume": "yes"})
    expected = langgraph_turns([{"question": "a"}, {"question": "b"}, Command(resume="yes")])
    assert [without_ids(paused), without_ids(again), done] == expected
    assert done["log"] == ["noted a", "noted b", "answered", "done"]  # turn a kept
    runs = {r["run_id"]: r["status"] for r in client.runs.list(thread)}
    assert runs.pop(first["run_id"]) == "interrupted"  # the paused run ended, superseded
    assert list(runs.values()) == ["success"]  # the second run, paused then resumed


def test_a_running_run_still_keeps_the_thread_busy(svc: Served) -> None:
    client = svc.client
    thread = client.threads.create()["thread_id"]
    GATES[thread] = threading.Event()
    running = client.runs.create(thread, "gated", input={"log": []})
    wait_until(
        lambda: client.runs.get(thread, running["run_id"])["status"] == "running", 30, "running"
    )
    with pytest.raises(ConflictError) as refused:
        client.runs.create(thread, "gated", input={"log": []}, multitask_strategy="reject")
    assert refused.value.body["error"] == "thread_busy"  # type: ignore[index]
    queued = client.runs.create(thread, "gated", input={"log": []})  # enqueue: waits its turn
    assert client.runs.get(thread, queued["run_id"])["status"] == "pending"
    GATES[thread].set()
    client.runs.join(thread, queued["run_id"])
    statuses = [client.runs.get(thread, r["run_id"])["status"] for r in (running, queued)]
    assert statuses == ["success", "success"]


def test_a_run_paused_on_an_approval_stays_the_threads_active_run(svc: Served) -> None:
    # Its approvers, deadline and escalation are Keel's promise: new input does not end it.
    client = svc.client
    thread = client.threads.create()["thread_id"]
    client.runs.create(thread, "review", input={"question": "refund?"})
    wait_until(lambda: [r["status"] for r in client.runs.list(thread)] == ["success"], 30, "paused")
    with pytest.raises(ConflictError):
        client.runs.create(thread, "review", input={"question": "b"}, multitask_strategy="reject")
    queued = client.runs.create(thread, "review", input={"question": "b"})
    assert client.runs.get(thread, queued["run_id"])["status"] == "pending"
    (waiting,) = [r for r in svc.app.thread_runs(thread) if r["status"] == "waiting"]
    assert svc.app.approve(waiting["run_id"], by="manager").recorded
    wait_until(lambda: client.runs.get(thread, queued["run_id"])["status"] == "success", 30, "next")


@pytest.mark.parametrize("as_node", [None, "ask"])
def test_a_resume_after_a_state_update_resumes_the_updated_checkpoint(
    svc: Served, as_node: str | None
) -> None:
    # LangGraph resumes a checkpoint, not a run: the update ended the paused run, and the
    # resume is a new run from the update's checkpoint (the node asked again gets the answer).
    client = svc.client
    thread = client.threads.create()["thread_id"]
    client.runs.wait(thread, "noted", input={"question": "a"})
    client.threads.update_state(thread, {"question": "b"}, as_node=as_node)
    assert client.threads.get_state(thread)["next"] == ["done" if as_node else "ask"]
    done = client.runs.wait(thread, "noted", command={"resume": "yes"})
    graph = noted().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    graph.invoke({"question": "a"}, config)
    graph.update_state(config, {"question": "b"}, as_node=as_node)
    assert done == jsonable(graph.invoke(Command(resume="yes"), config))
    assert client.threads.get_state(thread)["next"] == []
    with pytest.raises(ConflictError) as refused:  # nothing is paused any more
        client.runs.create(thread, "noted", command={"resume": "again"})
    assert refused.value.body["error"] == "no_pending_wait"  # type: ignore[index]


def test_a_resume_stream_after_a_state_update_streams_the_new_run(svc: Served) -> None:
    client = svc.client
    thread = client.threads.create()["thread_id"]
    client.runs.wait(thread, "noted", input={"question": "a"})
    client.threads.update_state(thread, {"question": "b"})
    parts = client.runs.stream(thread, "noted", command={"resume": "yes"}, stream_mode="updates")
    updates = [p.data for p in parts if p.event == "updates"]
    assert updates == [{"ask": {"answer": "yes", "log": ["answered"]}}, {"done": {"log": ["done"]}}]
    runs = client.runs.list(thread)  # newest first
    assert runs[0]["run_id"] != runs[-1]["run_id"] and runs[0]["status"] == "success"
