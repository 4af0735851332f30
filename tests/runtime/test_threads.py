"""Threads: a conversation of many runs over one checkpoint lineage, on both backends.

Each turn starts from the thread's latest checkpoint and merges its input through the graph's
reducers; an `interrupt()` is answered with any JSON value; state and history read back as
LangGraph's own; forks branch the history; a state update is a run of its own. The oracle is
LangGraph itself: the same commands on the same graph with `InMemorySaver`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

import keel
from keel.core.errors import (
    DecisionConflict,
    InvalidInput,
    NoPendingWait,
    ThreadBusy,
    ThreadNotFound,
    TransientError,
    UsageError,
    WrongWaitKind,
)
from keel.runtime.snapshot_json import state_json
from tests.support.checks import wait_until
from tests.support.graphs import notify_effect
from tests.support.notifiers import Recorder
from tests.support.providers import Provider
from tests.support.thread_graphs import Chat, asking, chat, reviewing
from tests.support.workers import drain, sweep

AppFactory = Callable[..., keel.App]


def texts(values: dict[str, Any]) -> list[str]:
    return [m.content for m in values["messages"]]


def test_turns_on_a_thread_merge_through_reducers_as_langgraph_does(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    runs = []
    for text in ("hi", "how are you", "bye"):
        runs.append(app.submit("chat", {"messages": [("user", text)]}, thread_id="t-1").run_id)
        drain(app)
    assert len(set(runs)) == 3  # no job id: each submission is a run of its own
    state = app.get_state("t-1")

    oracle = chat().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "o"}}
    for text in ("hi", "how are you", "bye"):
        oracle.invoke({"messages": [("user", text)]}, config)
    expected = oracle.get_state(config)
    assert texts(state.values) == texts(expected.values)
    assert state.values["turns"] == expected.values["turns"] == 3
    assert state.next == expected.next == ()
    assert [r["run_id"] for r in app.thread_runs("t-1")] == runs
    assert [r["thread_seq"] for r in app.thread_runs("t-1")] == [1, 2, 3]
    assert app.get_thread("t-1")["status"] == "idle"
    history = app.get_history("t-1")
    assert len(history) == len(list(oracle.get_state_history(config)))
    assert (
        history[0].config["configurable"]["checkpoint_id"]
        == (state.config["configurable"]["checkpoint_id"])
    )
    # Each checkpoint names the run that wrote it.
    assert {h.metadata.get("keel_run_id") for h in history} == set(runs)


def test_an_interrupt_is_resumed_with_any_value_once(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("ask")(asking)
    run_id = app.submit("ask", {"question": "color?"}, thread_id="t-ask").run_id
    drain(app)
    assert app.get_thread("t-ask")["status"] == "interrupted"
    state = app.get_state("t-ask")
    assert state.next == ("ask",)
    assert state.tasks[0].interrupts[0].value == {"question": "color?"}

    row = app.resume("t-ask", {"color": "teal", "shades": [1, 2]}, by="alice")
    assert row["run_id"] == run_id and row["status"] == "queued"
    with pytest.raises(DecisionConflict, match="already answered"):
        app.resume("t-ask", "red", by="bob")
    drain(app)
    final = app.get_state("t-ask").values
    assert final["answer"] == {"color": "teal", "shades": [1, 2]}  # the value itself
    assert final["log"] == ["asked color?", "done"]
    assert app.get_run(run_id).status == "completed"
    with pytest.raises(NoPendingWait):
        app.resume("t-ask", "late")


def test_a_thread_past_a_thousand_runs_finds_its_active_run(make_app: AppFactory) -> None:
    """A long conversation (a chat, a schedule on a thread) passes any page of runs: the run
    waiting now is still the one every resume path answers, and the latest runs list first."""
    app = make_app()
    app.workflow("ask")(asking)
    submitted = [
        app.submit(
            "ask", {"question": f"q{n}?"}, thread_id="t-long", multitask_strategy="interrupt"
        ).run_id
        for n in range(1002)  # each stops the one before it while it is still queued
    ]
    drain(app)
    latest = submitted[-1]
    assert app.get_thread("t-long")["status"] == "interrupted"
    active = app.active_run("t-long")
    assert active is not None and (active["run_id"], active["status"]) == (latest, "waiting")
    newest = app.thread_runs("t-long", 3, newest=True)
    assert [r["run_id"] for r in newest] == submitted[:-4:-1]
    with pytest.raises(ThreadBusy) as busy:
        app.delete_thread("t-long")
    assert busy.value.active_run == latest
    row = app.resume("t-long", "teal", by="alice")
    assert row["run_id"] == latest
    drain(app)
    assert app.get_run(latest).status == "completed"
    assert app.active_run("t-long") is None


def test_new_input_that_ends_a_pause_drops_the_request_queued_about_it(
    make_app: AppFactory,
) -> None:
    """The request about an `interrupt()` that new input on its thread ended asks a person to
    answer a question nobody waits on any more: it is dropped, never sent (held back here by a
    provider's 429 until the pause is over, as a slow provider would)."""
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("ask")(asking)
    slack = Recorder("slack", ("request",), failures=[TransientError("429", retry_after=60)])
    app.add_notifier(slack)
    paused = app.submit("ask", {"question": "a"}, thread_id="t-gone").run_id
    drain(app)
    app.aio.runtime.portal.call(app.aio.runtime.dispatch("worker-x"))  # the 429, if not yet
    app.submit("ask", {"question": "b"}, thread_id="t-gone", end_paused=True)
    drain(app)
    assert app.get_run(paused).termination_reason == "interrupted"
    clock.advance(61)
    app.aio.runtime.portal.call(app.aio.runtime.dispatch("worker-x"))
    requests = {n["run_id"]: n["status"] for n in app.get_run(paused).notifications}
    assert requests == {paused: "obsolete"}
    assert all(note.run_id != paused for note in slack.sent), "the ended pause's request"


def test_reject_refuses_a_second_run_while_one_is_unfinished(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("ask")(asking)
    first = app.submit("ask", {"question": "a"}, thread_id="t-busy").run_id
    with pytest.raises(ThreadBusy, match=first):
        app.submit("ask", {"question": "b"}, thread_id="t-busy", multitask_strategy="reject")
    assert len(app.thread_runs("t-busy")) == 1


def test_enqueued_runs_wait_for_the_active_one_in_order(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("ask")(asking)
    first = app.submit("ask", {"question": "a"}, thread_id="t-q").run_id
    second = app.submit("ask", {"question": "b"}, thread_id="t-q").run_id
    drain(app)
    # The first waits for its answer; the second stays queued behind it.
    assert app.get_run(first).status == "waiting"
    assert app.get_run(second).status == "queued"
    app.resume("t-q", "A")
    drain(app)
    assert app.get_run(first).status == "completed"
    assert app.get_run(second).status == "waiting"  # now the thread's active run
    assert app.get_state("t-q").values["question"] == "b"


def test_interrupt_strategy_stops_the_waiting_run_and_goes_on(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("ask")(asking)
    first = app.submit("ask", {"question": "a"}, thread_id="t-i").run_id
    drain(app)
    second = app.submit(
        "ask", {"question": "b"}, thread_id="t-i", multitask_strategy="interrupt"
    ).run_id
    one = app.get_run(first)
    assert (one.status, one.termination_reason) == ("cancelled", "interrupted")
    drain(app)
    assert app.get_run(second).status == "waiting"
    assert app.get_state("t-i").tasks[0].interrupts[0].value == {"question": "b"}


def test_rollback_discards_the_superseded_runs_checkpoints(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    app.workflow("ask")(asking)
    app.submit("ask", {"question": "keep"}, thread_id="t-r")
    drain(app)
    app.resume("t-r", "kept")
    drain(app)
    before = app.get_state("t-r")
    doomed = app.submit("ask", {"question": "drop"}, thread_id="t-r").run_id
    drain(app)  # it waits on its interrupt, its checkpoints written
    app.submit("ask", {"question": "new"}, thread_id="t-r", multitask_strategy="rollback")
    rolled = app.get_run(doomed)
    assert (rolled.status, rolled.termination_reason) == ("cancelled", "rolled_back")
    drain(app)
    history = app.get_history("t-r")
    assert doomed not in {h.metadata.get("keel_run_id") for h in history}
    state = app.get_state("t-r")
    assert state.values["question"] == "new"
    assert state.values["log"] == before.values["log"]  # nothing of the rolled-back run


def test_a_fork_from_a_checkpoint_the_thread_has_not_is_refused(make_app: AppFactory) -> None:
    """LangGraph starts from an empty state for a checkpoint it cannot find: the fork became
    the thread's latest state and the conversation was reset."""
    app = make_app()
    app.workflow("chat")(chat)
    app.submit("chat", {"messages": [("user", "hello")]}, thread_id="t-nf")
    drain(app)
    with pytest.raises(keel.CheckpointNotFound, match="no checkpoint 'nope'"):
        app.submit("chat", {"messages": [("user", "x")]}, thread_id="t-nf", checkpoint_id="nope")
    with pytest.raises(keel.CheckpointNotFound):
        app.get_state("t-nf", "nope")
    assert len(app.thread_runs("t-nf")) == 1
    assert texts(app.get_state("t-nf").values)[0] == "hello"


def test_a_fork_branches_history_like_langgraph(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    for text in ("one", "two"):
        app.submit("chat", {"messages": [("user", text)]}, thread_id="t-f")
        drain(app)
    after_one = next(h for h in app.get_history("t-f") if h.values.get("turns") == 1 and not h.next)
    fork_at = after_one.config["configurable"]["checkpoint_id"]
    app.submit("chat", {"messages": [("user", "other")]}, thread_id="t-f", checkpoint_id=fork_at)
    drain(app)

    oracle = chat().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "o"}}
    oracle.invoke({"messages": [("user", "one")]}, config)
    oracle.invoke({"messages": [("user", "two")]}, config)
    point = next(
        h for h in oracle.get_state_history(config) if h.values.get("turns") == 1 and not h.next
    )
    oracle.invoke({"messages": [("user", "other")]}, point.config)
    assert texts(app.get_state("t-f").values) == texts(oracle.get_state(config).values)
    # Both branches stay readable: the old head is still in the history.
    history = app.get_history("t-f")
    assert any(h.values.get("turns") == 2 and "two" in texts(h.values) for h in history)
    assert len(history) == len(list(oracle.get_state_history(config)))


def test_update_state_is_a_run_and_a_checkpoint(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    app.submit("chat", {"messages": [("user", "hi")]}, thread_id="t-u")
    drain(app)
    updated: dict[str, Any] = {}

    def update() -> None:
        updated["row"] = app.update_state("t-u", {"turns": 10}, as_node="reply", timeout=30)

    caller = threading.Thread(target=update)
    caller.start()
    wait_until(lambda: len(app.thread_runs("t-u")) == 2, 10, "the update's run")
    drain(app)
    caller.join(30)
    assert updated["row"]["status"] == "completed"
    state = app.get_state("t-u")
    assert state.values["turns"] == 11
    assert state.metadata["keel_run_id"] == updated["row"]["run_id"]


def test_a_command_starts_a_run_with_update_and_goto(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("ask")(asking)
    app.submit(
        "ask", command={"update": {"question": "q", "answer": 1}, "goto": "done"}, thread_id="t-c"
    )
    drain(app)
    values = app.get_state("t-c").values
    assert values["log"] == ["done"] and values["answer"] == 1

    oracle = asking().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "o"}}
    oracle.invoke(Command(update={"question": "q", "answer": 1}, goto="done"), config)
    assert oracle.get_state(config).values == values


def test_threads_are_created_found_searched_copied_and_deleted(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    made = app.create_thread("chat", thread_id="t-s", metadata={"user": "ann", "tier": 2})
    assert (made["status"], made["metadata"]) == ("idle", {"user": "ann", "tier": 2})
    app.create_thread("chat", metadata={"user": "bob"})
    assert [t["thread_id"] for t in app.search_threads(metadata={"user": "ann"})] == ["t-s"]
    assert [t["thread_id"] for t in app.search_threads(metadata={"tier": 2})] == ["t-s"]
    app.submit("chat", {"messages": [("user", "hi")]}, thread_id="t-s")
    drain(app)
    copy = app.copy_thread("t-s", to="t-copy")
    assert copy["metadata"] == {"user": "ann", "tier": 2}
    assert texts(app.get_state("t-copy").values) == texts(app.get_state("t-s").values)
    app.delete_thread("t-s")
    with pytest.raises(ThreadNotFound):
        app.get_thread("t-s")
    assert texts(app.get_state("t-copy").values) == ["hi", "echo: hi"]


def test_merge_metadata_is_written_with_the_admission_and_only_with_it(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    turn = {"messages": [("user", "hi")]}
    app.submit("chat", turn, thread_id="t-m", metadata={"user": "ann"}, merge_metadata={"g": 1})
    assert app.get_thread("t-m")["metadata"] == {"user": "ann", "g": 1}
    # `metadata` names a new thread's only; `merge_metadata` merges into an existing one's.
    app.submit("chat", turn, thread_id="t-m", metadata={"user": "bob"}, merge_metadata={"g": 2})
    assert app.get_thread("t-m")["metadata"] == {"user": "ann", "g": 2}
    # A refused admission merges nothing: the merge is in its transaction.
    with pytest.raises(ThreadBusy):
        app.submit(
            "chat", turn, thread_id="t-m", multitask_strategy="reject", merge_metadata={"g": 3}
        )
    assert app.get_thread("t-m")["metadata"] == {"user": "ann", "g": 2}
    assert len(app.thread_runs("t-m")) == 2
    with pytest.raises(UsageError):
        app.submit("chat", turn, merge_metadata={"g": 4})
    drain(app)
    assert [r["status"] for r in app.thread_runs("t-m")] == ["completed", "completed"]


def test_each_turn_is_a_run_with_its_own_effect_keys(make_app: AppFactory) -> None:
    provider = Provider()
    notify = notify_effect(provider)

    def notifying() -> StateGraph:
        def reply(state: Chat) -> dict[str, Any]:
            notify(state["messages"][-1].content)
            return {"turns": 1}

        g = StateGraph(Chat)
        g.add_node("reply", reply)
        g.add_edge(START, "reply")
        g.add_edge("reply", END)
        return g

    app = make_app()
    app.workflow("notify-chat")(notifying)
    runs = []
    for text in ("same", "same", "same"):  # the same call at the same node, every turn
        runs.append(app.submit("notify-chat", {"messages": [("user", text)]}, thread_id="t-e"))
        drain(app)
    assert len(provider.deliveries) == len(set(provider.deliveries)) == 3
    for run in runs:
        effects = app.get_run(run.run_id).effects
        assert [e["run_id"] for e in effects] == [run.run_id]
        assert effects[0]["idempotency_key"] in provider.deliveries


class Deadline(TypedDict, total=False):
    got: Any


def deadline_graph() -> StateGraph:
    def ask(state: Deadline) -> dict[str, Any]:
        return {"got": keel.interrupt({"q": "size?"}, timeout="1h", on_timeout="timeout")}

    g = StateGraph(Deadline)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def test_keel_interrupt_has_a_deadline_whose_policy_resumes_it(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("deadline")(deadline_graph)
    answered = app.submit("deadline", {}, thread_id="t-d1").run_id
    late = app.submit("deadline", {}, thread_id="t-d2").run_id
    drain(app)
    # The value a chat UI shows is the interrupt's own, whatever Keel wraps around it.
    assert app.get_state("t-d1").tasks[0].interrupts[0].value["keel_wait"]["payload"] == {
        "q": "size?"
    }
    app.resume("t-d1", "XL")
    clock.advance(3601)
    assert sweep(app) >= 1
    drain(app)
    assert app.get_state("t-d1").values["got"] == "XL"
    timed_out = app.get_state("t-d2").values["got"]
    assert timed_out["decision"] == "timed_out"
    assert app.get_run(answered).status == app.get_run(late).status == "completed"


def test_state_json_shows_an_interrupts_own_value(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("deadline")(deadline_graph)
    app.workflow("ask")(asking)
    app.submit("deadline", {}, thread_id="t-j1")
    app.submit("ask", {"question": "why?"}, thread_id="t-j2")
    drain(app)
    wrapped = state_json(app.get_state("t-j1"))
    plain = state_json(app.get_state("t-j2"))
    assert wrapped["interrupts"][0]["value"] == {"q": "size?"}
    assert wrapped["tasks"][0]["interrupts"][0]["value"] == {"q": "size?"}
    assert plain["interrupts"][0]["value"] == {"question": "why?"}
    assert plain["next"] == ["ask"] and plain["values"] == {"question": "why?", "log": []}
    assert plain["checkpoint"]["thread_id"] == "t-j2" and plain["parent_checkpoint_id"]


def test_a_failed_turn_resumes_only_while_it_is_the_threads_latest(make_app: AppFactory) -> None:
    broken = [True]

    def flaky() -> StateGraph:
        def reply(state: Chat) -> dict[str, Any]:
            if broken[0]:
                raise RuntimeError("provider down")
            return {"turns": 1}

        g = StateGraph(Chat)
        g.add_node("reply", reply)
        g.add_edge(START, "reply")
        g.add_edge("reply", END)
        return g

    app = make_app()
    app.workflow("flaky")(flaky)
    first = app.submit("flaky", {"messages": [("user", "a")]}, thread_id="t-fail").run_id
    drain(app)
    assert app.get_thread("t-fail")["status"] == "error"
    broken[0] = False
    assert app.resume(first)["status"] == "queued"  # the latest turn: it goes on
    drain(app)
    broken[0] = True
    second = app.submit("flaky", {"messages": [("user", "b")]}, thread_id="t-fail").run_id
    drain(app)
    app.submit("flaky", {"messages": [("user", "c")]}, thread_id="t-fail")
    drain(app)
    with pytest.raises(keel.InvalidTransition, match="not the latest run"):
        app.resume(second)
    assert app.get_run(second).status == "failed"


@dataclass
class Tenant:
    tenant: str


class Seen(TypedDict, total=False):
    model: str
    tenant: str
    thread: str
    configured_tenant: str
    run: str


def configured() -> StateGraph:
    def look(state: Seen, config: RunnableConfig, runtime: Runtime[Tenant]) -> dict[str, Any]:
        configurable = config["configurable"]
        return {
            "model": configurable["model"],
            "thread": configurable["thread_id"],
            "tenant": runtime.context.tenant,
            # Keel's own runs keep their context out of configurable (its plain values would
            # land in every checkpoint's metadata); the run's id is there.
            "configured_tenant": configurable.get("tenant", "not there"),
            "run": configurable["run_id"],
        }

    g = StateGraph(Seen, context_schema=Tenant)
    g.add_node("look", look)
    g.add_edge(START, "look")
    g.add_edge("look", END)
    return g


def test_config_and_context_reach_the_graph_as_in_langgraph(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("configured")(configured)
    run = app.submit(
        "configured",
        {},
        thread_id="t-cfg",
        config={"configurable": {"model": "small", "thread_id": "not-this"}},
        context={"tenant": "acme"},
    )
    drain(app)
    assert app.get_run(run.run_id).status == "completed"
    # The thread's id is Keel's to set: a configurable thread_id does not move the run.
    assert app.get_state("t-cfg").values == {
        "model": "small",
        "tenant": "acme",
        "thread": "t-cfg",
        "configured_tenant": "not there",
        "run": run.run_id,
    }
    assert all("tenant" not in h.metadata for h in app.get_history("t-cfg"))


class Loop(TypedDict, total=False):
    n: int
    until: int


def looping() -> StateGraph:
    """One node that runs again until `n` reaches `until`: one step per turn."""
    g = StateGraph(Loop)
    g.add_node("tick", lambda s: {"n": s.get("n", 0) + 1})
    g.add_edge(START, "tick")
    g.add_conditional_edges("tick", lambda s: END if s["n"] >= s["until"] else "tick")
    return g


def asking_beside_a_nap() -> StateGraph:
    """Two branches of one step: one asks (`interrupt()`), the other sleeps (a timer)."""

    def nap(state: Loop) -> dict[str, Any]:
        keel.sleep("1h")
        return {}

    g = StateGraph(Loop)
    g.add_node("ask", lambda s: {"n": len(str(interrupt("q")))})
    g.add_node("nap", nap)
    g.add_edge(START, "ask")
    g.add_edge(START, "nap")
    g.add_edge("ask", END)
    g.add_edge("nap", END)
    return g


def test_a_resume_keyed_by_interrupt_ids_is_taken_whole_or_not_at_all(
    make_app: AppFactory,
) -> None:
    """One answer of the map that cannot be taken (a timer's: nobody answers it) records none
    of the others: the corrected map is then taken, not refused as already answered."""
    app = make_app()
    app.workflow("both")(asking_beside_a_nap)
    run_id = app.submit("both", {}, thread_id="t-map").run_id
    drain(app)
    ids = {w["kind"]: w["interrupt_id"] for w in app.get_run(run_id).waits}
    with pytest.raises(WrongWaitKind):
        app.resume("t-map", {ids["interrupt"]: "yes", ids["timer"]: "wake"})
    assert {w["status"] for w in app.get_run(run_id).waits} == {"pending"}
    assert app.resume("t-map", {ids["interrupt"]: "yes"})["run_id"] == run_id
    assert [w["status"] for w in app.get_run(run_id).waits if w["kind"] == "interrupt"] == [
        "decided"
    ]


def test_the_recursion_limit_is_the_runs_then_the_graphs_then_the_workflows(
    make_app: AppFactory,
) -> None:
    """As LangGraph: a run's `recursion_limit` wins over the one its compiled graph was bound
    with (deep agents bind 1000), which wins over the workflow's (100 unless registered)."""
    app = make_app()
    app.workflow("loop")(looping)
    app.workflow("bound")(lambda: looping().compile().with_config(recursion_limit=300))
    deep = app.submit("loop", {"until": 150}, config={"recursion_limit": 300}).run_id
    capped = app.submit("loop", {"until": 5}, config={"recursion_limit": 3}).run_id
    default = app.submit("loop", {"until": 150}).run_id
    bound = app.submit("bound", {"until": 150}).run_id
    drain(app)
    ended = {r: app.get_run(r) for r in (deep, capped, default, bound)}
    assert [ended[r].status for r in (deep, capped, default, bound)] == [
        "completed",
        "failed",
        "failed",
        "completed",
    ]
    assert "Recursion limit of 3 reached" in str(ended[capped].run["error"])
    assert "Recursion limit of 100 reached" in str(ended[default].run["error"])
    with pytest.raises(InvalidInput, match="recursion_limit"):
        app.submit("loop", {"until": 1}, config={"recursion_limit": "many"})


def test_a_rollback_holds_even_when_the_run_that_asked_for_it_never_ran(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("ask")(asking)
    app.submit("ask", {"question": "keep"}, thread_id="t-rr")
    drain(app)
    app.resume("t-rr", "kept")
    drain(app)
    doomed = app.submit("ask", {"question": "drop"}, thread_id="t-rr").run_id
    drain(app)
    asker = app.submit("ask", {"question": "b"}, thread_id="t-rr", multitask_strategy="rollback")
    app.cancel(asker.run_id)  # cancelled while queued: it never discards anything itself
    app.submit("ask", {"question": "c"}, thread_id="t-rr")
    drain(app)
    assert doomed not in {h.metadata.get("keel_run_id") for h in app.get_history("t-rr")}
    assert app.get_state("t-rr").values["log"] == ["asked keep", "done"]


def test_update_state_on_an_interrupted_thread_answers_it_as_langgraph_does(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("ask")(asking)
    waiting = app.submit("ask", {"question": "q"}, thread_id="t-ui").run_id
    drain(app)
    done: dict[str, Any] = {}
    caller = threading.Thread(
        target=lambda: done.update(
            row=app.update_state("t-ui", {"answer": "edited", "log": ["x"]}, as_node="ask")
        )
    )
    caller.start()
    wait_until(lambda: len(app.thread_runs("t-ui")) == 2, 10, "the update's run")
    drain(app)
    caller.join(30)
    assert done["row"]["status"] == "completed"
    ended = app.get_run(waiting)
    assert (ended.status, ended.termination_reason) == ("cancelled", "interrupted")
    app.submit("ask", None, thread_id="t-ui")  # go on from the update, as invoke(None) does
    drain(app)

    oracle = asking().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "o"}}
    oracle.invoke({"question": "q"}, config)
    oracle.update_state(config, {"answer": "edited", "log": ["x"]}, as_node="ask")
    oracle.invoke(None, config)
    assert app.get_state("t-ui").values == oracle.get_state(config).values
    assert app.get_thread("t-ui")["status"] == "idle"


def test_a_run_paused_where_it_began_resumes_there_with_its_answer(make_app: AppFactory) -> None:
    """A run without input on a thread paused on `interrupt()` (LangGraph's view: the paused
    run has returned) asks again on that run's checkpoint, writing none of its own. Answered,
    it was started over, asked again, found its wait decided and was queued again, for ever."""
    app = make_app()
    app.workflow("ask")(asking)
    app.submit("ask", {"question": "q"}, thread_id="t-pb")
    drain(app)
    again = app.submit("ask", None, thread_id="t-pb", end_paused=True).run_id
    drain(app)
    assert app.get_run(again).status == "waiting"
    app.resume("t-pb", "yes")
    drain(app)
    ended = app.get_run(again)
    assert ended.status == "completed"
    assert [e["kind"] for e in ended.timeline].count("lease.claimed") == 2
    assert app.get_state("t-pb").values["answer"] == "yes"


def test_update_state_never_ends_an_approval_it_queues_behind(make_app: AppFactory) -> None:
    """An approval's approvers, deadline and escalation are Keel's promise: an operator's edit
    of the thread's state waits for the decision instead of cancelling the run (it did, as if
    the approval were a plain interrupt)."""
    app = make_app()
    app.workflow("review")(reviewing)
    waiting = app.submit("review", {"question": "q"}, thread_id="t-ua").run_id
    drain(app)
    assert app.get_run(waiting).status == "waiting"
    with pytest.raises(TimeoutError):
        app.update_state("t-ua", {"log": ["edited"]}, timeout=0.5)
    held = app.get_run(waiting)
    assert held.status == "waiting" and [w["status"] for w in held.waits] == ["pending"]
    app.approve(waiting, by="alice")
    drain(app)
    assert app.get_run(waiting).status == "completed"
    update = app.thread_runs("t-ua")[-1]
    assert update["run_id"] != waiting and app.get_run(update["run_id"]).status == "completed"
    assert app.get_state("t-ua").values["log"] == ["edited"]
    assert app.get_state("t-ua").values["answer"] == "approved"


def test_an_update_the_graph_cannot_take_is_refused_or_fails_once(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    app.submit("chat", {"messages": [("user", "hi")]}, thread_id="t-bad")
    drain(app)
    with pytest.raises(keel.core.errors.UsageError, match="not a node of chat@1"):
        app.update_state("t-bad", {"turns": 1}, as_node="nope")
    assert len(app.thread_runs("t-bad")) == 1  # nothing admitted
    done: dict[str, Any] = {}
    caller = threading.Thread(
        target=lambda: done.update(row=app.update_state("t-bad", {"turns": "x"}, timeout=30))
    )
    caller.start()
    wait_until(lambda: len(app.thread_runs("t-bad")) == 2, 10, "the update's run")
    drain(app)
    caller.join(30)
    failed = app.get_run(done["row"]["run_id"])
    assert (failed.status, failed.termination_reason) == ("failed", "execution_error")
    assert [e["kind"] for e in failed.timeline].count("lease.claimed") == 1  # not retried
    assert app.get_state("t-bad").values["turns"] == 1  # the thread is as it was


class Messages(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def typed_chat() -> StateGraph:
    def reply(state: Messages) -> dict[str, Any]:
        return {"messages": [("ai", f"echo: {state['messages'][-1].content}")]}

    g = StateGraph(Messages)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g


def test_every_message_form_langgraph_takes_is_admitted(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("typed-chat")(typed_chat)
    forms: list[Any] = [
        [("user", "a")],
        [{"role": "user", "content": "b"}],  # what langgraph-sdk clients send
        ["c"],
        [{"type": "human", "content": "d"}],
    ]
    for form in forms:
        app.submit("typed-chat", {"messages": form}, thread_id="t-forms")
        drain(app)
    assert texts(app.get_state("t-forms").values)[::2] == ["a", "b", "c", "d"]
    with pytest.raises(keel.InvalidInput, match="not a field"):
        app.submit("typed-chat", {"mesages": ["typo"]}, thread_id="t-forms")


def test_a_configs_checkpoint_id_does_not_move_the_run(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("chat")(chat)
    for text in ("one", "two"):
        app.submit("chat", {"messages": [("user", text)]}, thread_id="t-cp")
        drain(app)
    oldest = app.get_history("t-cp")[-1].config["configurable"]["checkpoint_id"]
    config = {"configurable": {"checkpoint_id": oldest, "checkpoint_ns": "x"}}
    app.submit("chat", {"messages": [("user", "three")]}, thread_id="t-cp", config=config)
    drain(app)
    # A fork is asked with checkpoint_id=; a config's would send every restart back there.
    assert app.get_state("t-cp").values["turns"] == 3
