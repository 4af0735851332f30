"""The Agent Server protocol's runs and streams, on both backends, driven only through
langgraph-sdk: a real uvicorn server on 127.0.0.1, a real worker in this process.

What a stream sends is compared with what LangGraph's own `graph.stream` sends for the same
graph and input on an InMemorySaver (message and interrupt ids aside: they are random).
Background runs, waits, joins, cancels (interrupt and rollback), strategies, stateless runs,
and `join_stream` resumed from any event's id: each event once, none missing.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from fastapi import FastAPI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config, get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

import keel
from keel.runtime.snapshot_json import jsonable
from keel.runtime.worker import Worker
from keel.service.agent_server import agent_server_router
from keel.service.agent_server.runs import runs_router
from keel.service.agent_server.shapes import assistant_id_of
from keel.service.auth import Authenticator, load_tokens
from keel.service.errors import install
from tests.support.apps.service import LiveServer
from tests.support.checks import wait_until
from tests.support.graphs import one_node
from tests.support.service_client import ADMIN, READER, TOKENS, bearer
from tests.support.thread_graphs import asking, chat, register

Part = tuple[str, Any]


# -- graphs beyond the thread tests' `chat` and `ask` -----------------------------------------


class Log(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    n: int


def three_steps() -> StateGraph:
    """first -> quiet (writes nothing) -> last."""
    g = StateGraph(Log)
    g.add_node("first", lambda s: {"log": ["first"], "n": 1})
    g.add_node("quiet", lambda s: None)
    g.add_node("last", lambda s: {"log": ["last"]})
    g.add_edge(START, "first")
    g.add_edge("first", "quiet")
    g.add_edge("quiet", "last")
    g.add_edge("last", END)
    return g


GATES: dict[str, threading.Event] = {}
"""The gate a `gated` run's `hold` node waits at, by thread id (opened by the test); a thread
without one passes."""


def gated() -> StateGraph:
    """before -> hold (waits at its thread's gate) -> after."""

    def hold(state: Log) -> dict[str, Any]:
        gate = GATES.get(get_config()["configurable"]["thread_id"])
        assert gate is None or gate.wait(60), "the test never opened the gate"
        return {"log": ["held"]}

    g = StateGraph(Log)
    g.add_node("before", lambda s: {"log": ["before"]})
    g.add_node("hold", hold)
    g.add_node("after", lambda s: {"log": ["after"]})
    g.add_edge(START, "before")
    g.add_edge("before", "hold")
    g.add_edge("hold", "after")
    g.add_edge("after", END)
    return g


def failing() -> StateGraph:
    def ok(state: Log) -> dict[str, Any]:
        return {"log": ["ok"]}

    def boom(state: Log) -> dict[str, Any]:
        raise ValueError("boom")

    g = StateGraph(Log)
    g.add_node("ok", ok)
    g.add_node("boom", boom)
    g.add_edge(START, "ok")
    g.add_edge("ok", "boom")
    g.add_edge("boom", END)
    return g


# -- a server, a worker, a client ---------------------------------------------------------------


@dataclass
class Served:
    app: keel.App
    url: str
    client: SyncLangGraphClient


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    app = register(make_app(lease_ttl=5))
    workflows = [("steps", three_steps), ("gated", gated), ("failing", failing)]
    for name, factory in [*workflows, ("twice", asking_twice)]:
        app.workflow(name)(factory)
    api = FastAPI()
    install(api)
    auth = Authenticator(load_tokens(TOKENS))
    protocol = agent_server_router(app, auth)
    api.include_router(protocol)
    if not any(getattr(r, "path", "") == "/runs/stream" for r in protocol.routes):
        api.include_router(runs_router(app, auth))
    with LiveServer(api) as live:
        client = get_sync_client(url=live.url, api_key=ADMIN)
        try:
            yield Served(app, live.url, client)
        finally:
            for gate in GATES.values():
                gate.set()
            GATES.clear()


@contextmanager
def live_worker(app: keel.App) -> Iterator[None]:
    """A worker executing runs as they come."""
    worker = Worker(app.aio.runtime, concurrency=2)
    loop = app.aio.runtime.portal.loop
    done = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        yield
    finally:
        for gate in GATES.values():
            gate.set()
        loop.call_soon_threadsafe(worker.stop)
        done.result(timeout=30)


@contextmanager
def serving(app: keel.App) -> Iterator[Served]:
    """The protocol's routes for `app` on a live server, a worker running, an SDK client."""
    api = FastAPI()
    install(api)
    api.include_router(agent_server_router(app, Authenticator(load_tokens(TOKENS))))
    with LiveServer(api) as live, live_worker(app):
        yield Served(app, live.url, get_sync_client(url=live.url, api_key=ADMIN))


@pytest.fixture
def svc(served: Served) -> Iterator[Served]:
    """The served App with a worker running."""
    with live_worker(served.app):
        yield served


def say(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def without_ids(value: Any) -> Any:
    """`value` without `id` keys: message and interrupt ids are random in each run."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def langgraph_parts(factory: Callable[[], StateGraph], turns: list[Any], modes: list[str]) -> Any:
    """What LangGraph's own `stream` sends for each turn on one thread (InMemorySaver)."""
    graph = factory().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    return [
        [
            (mode, without_ids(jsonable(chunk)))
            for mode, chunk in graph.stream(i, config, stream_mode=modes)
        ]
        for i in turns
    ]


def parts(stream: Any) -> list[Any]:
    return list(stream)


def data_parts(streamed: list[Any]) -> list[Part]:
    """The data events of a stream (no metadata, end), ids aside."""
    return [(p.event, without_ids(p.data)) for p in streamed if p.event not in ("metadata", "end")]


def new_thread(served: Served) -> str:
    return str(served.client.threads.create()["thread_id"])


# -- background runs ---------------------------------------------------------------------------


def test_a_background_run_is_admitted_then_joined(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    run = client.runs.create(thread, "chat", input=say("hi"), metadata={"purpose": "test"})
    assert (run["thread_id"], run["assistant_id"]) == (thread, assistant_id_of("chat"))
    assert run["status"] in ("pending", "running", "success")
    assert run["metadata"]["purpose"] == "test"
    assert run["kwargs"]["input"] == say("hi")
    # The fields langgraph dev (langgraph-api 0.16.7) answers for a run, and its kwargs'.
    assert set(run) >= {"run_id", "created_at", "updated_at", "multitask_strategy", "kwargs"}
    assert set(run["kwargs"]) >= {
        "input",
        "command",
        "config",
        "context",
        "stream_mode",
        "interrupt_before",
        "interrupt_after",
        "webhook",
        "feedback_keys",
        "temporary",
        "subgraphs",
        "resumable",
        "durability",
        "checkpoint_during",
    }
    assert run["created_at"].endswith("+00:00") and run["multitask_strategy"] == "enqueue"
    # Admitted before the answer: Keel has the run, durably.
    assert svc.app.get_run(run["run_id"]).run["thread_id"] == thread
    final = client.runs.join(thread, run["run_id"])
    assert [m["content"] for m in final["messages"]] == ["hi", "echo: hi"]
    assert final["turns"] == 1
    got = client.runs.get(thread, run["run_id"])
    assert (got["run_id"], got["status"]) == (run["run_id"], "success")
    # The run stamped its graph and assistant into the thread's metadata.
    meta = client.threads.get(thread)["metadata"]
    assert (meta["graph_id"], meta["assistant_id"]) == ("chat", assistant_id_of("chat"))
    second = client.runs.create(thread, assistant_id_of("chat"), input=say("again"))
    client.runs.join(thread, second["run_id"])
    listed = client.runs.list(thread)
    assert [r["run_id"] for r in listed] == [second["run_id"], run["run_id"]]  # newest first
    assert [r["run_id"] for r in client.runs.list(thread, limit=1, offset=1)] == [run["run_id"]]
    assert client.runs.list(thread, status="error") == []
    assert client.threads.get_state(thread)["values"]["turns"] == 2


def test_a_run_forks_from_a_past_checkpoint(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    client.runs.wait(thread, "chat", input=say("one"))
    first = client.threads.get_state(thread)["checkpoint_id"]
    client.runs.wait(thread, "chat", input=say("two"))

    def texts(values: dict[str, Any]) -> list[str]:
        return [m["content"] for m in values["messages"]]

    forked = client.runs.wait(thread, "chat", input=say("alt"), checkpoint_id=first)
    assert texts(forked) == ["one", "echo: one", "alt", "echo: alt"]
    # A checkpoint named in the config's configurable is a fork point too; a thread named
    # there changes nothing (the run is the thread's).
    config = {"configurable": {"checkpoint_id": first, "thread_id": "elsewhere"}}
    again = client.runs.wait(thread, "chat", input=say("alt2"), config=config)  # type: ignore[arg-type]
    assert texts(again) == ["one", "echo: one", "alt2", "echo: alt2"]
    assert texts(client.threads.get_state(thread)["values"])[-1] == "echo: alt2"


def test_wait_answers_the_final_values_the_interrupt_or_the_error(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    done = client.runs.wait(thread, "chat", input=say("w"))
    assert [m["content"] for m in done["messages"]] == ["w", "echo: w"]

    asked = new_thread(svc)
    paused = client.runs.wait(asked, "ask", input={"question": "color?"})
    (interrupt,) = paused.pop("__interrupt__")
    assert paused == {"question": "color?", "log": []}
    assert interrupt["value"] == {"question": "color?"} and interrupt["id"]
    (run,) = client.runs.list(asked)
    assert run["status"] == "success"  # paused: LangGraph's run has returned
    assert client.threads.get(asked)["status"] == "interrupted"

    failed = new_thread(svc)
    answer = client.runs.wait(failed, "failing", input={"log": []}, raise_error=False)
    assert answer == {"__error__": {"error": "ValueError", "message": "boom"}}
    with pytest.raises(Exception, match="ValueError: boom"):  # the SDK raises it by default
        client.runs.wait(failed, "failing", input={"log": []})
    assert [r["status"] for r in client.runs.list(failed)] == ["error", "error"]


# -- streams -----------------------------------------------------------------------------------


def test_streams_send_what_langgraph_sends(svc: Served) -> None:
    client = svc.client
    modes = ["values", "updates"]
    thread = new_thread(svc)
    turns = [say("hi"), say("how are you")]
    ours = [
        data_parts(parts(client.runs.stream(thread, "chat", input=i, stream_mode=modes)))
        for i in turns
    ]
    assert ours == langgraph_parts(chat, turns, modes)

    steps = new_thread(svc)
    streamed = parts(client.runs.stream(steps, "steps", input={"log": []}, stream_mode=modes))
    assert data_parts(streamed) == langgraph_parts(three_steps, [{"log": []}], modes)[0]
    assert ("updates", {"quiet": None}) in data_parts(streamed)
    (metadata,) = [p for p in streamed if p.event == "metadata"]
    assert streamed[0] is metadata and streamed[-1].event == "end"
    (run,) = client.runs.list(steps)
    assert metadata.data == {"run_id": run["run_id"], "attempt": 1}
    ids = [p.id for p in streamed]
    assert len(set(ids)) == len(ids) and all(ids)

    # One mode only: the same events of that mode.
    only = new_thread(svc)
    values = parts(client.runs.stream(only, "steps", input={"log": []}, stream_mode="values"))
    assert data_parts(values) == langgraph_parts(three_steps, [{"log": []}], ["values"])[0]


def test_an_interrupt_and_its_resume_stream_as_in_langgraph(svc: Served) -> None:
    client = svc.client
    modes = ["values", "updates"]
    thread = new_thread(svc)
    first = parts(client.runs.stream(thread, "ask", input={"question": "q?"}, stream_mode=modes))
    resumed = parts(
        client.runs.stream(thread, "ask", command={"resume": "teal"}, stream_mode=modes)
    )
    expected = langgraph_parts(asking, [{"question": "q?"}, Command(resume="teal")], modes)
    assert [data_parts(first), data_parts(resumed)] == expected
    assert first[-2].data["__interrupt__"][0]["value"] == {"question": "q?"}
    # The same Keel run went on: one run on the thread, ended.
    (run,) = client.runs.list(thread)
    assert first[0].data["run_id"] == resumed[0].data["run_id"] == run["run_id"]
    assert run["status"] == "success"
    assert client.threads.get_state(thread)["values"]["log"] == ["asked q?", "done"]
    # No event id of the first stream comes again in the second.
    assert not {p.id for p in first} & {p.id for p in resumed}


def asking_twice() -> StateGraph:
    """A node that asks again after its first answer (asking until the answer is valid)."""

    def ask(state: Log) -> dict[str, Any]:
        first = interrupt("first?")
        return {"log": [f"{first}, then {interrupt('second?')}"]}

    return one_node(Log, "ask", ask)


def test_a_node_that_asks_again_streams_each_pause_as_in_langgraph(svc: Served) -> None:
    """Each answer's stream tells the next pause: the second pause at the same checkpoint had
    the first's event ids, and the resume's stream dropped it as sent (only `end`)."""
    client = svc.client
    modes = ["values", "updates"]
    thread = new_thread(svc)
    turns: list[Any] = [{"log": []}, Command(resume="A"), Command(resume="B")]
    streamed = [
        parts(client.runs.stream(thread, "twice", input={"log": []}, stream_mode=modes)),
        parts(client.runs.stream(thread, "twice", command={"resume": "A"}, stream_mode=modes)),
        parts(client.runs.stream(thread, "twice", command={"resume": "B"}, stream_mode=modes)),
    ]
    assert [data_parts(s) for s in streamed] == langgraph_parts(asking_twice, turns, modes)
    assert streamed[1][-2].data["__interrupt__"][0]["value"] == "second?"
    ids = [p.id for s in streamed for p in s if p.event not in ("metadata", "end")]
    assert len(ids) == len(set(ids))
    # A rejoin from the start replays them in their places; of the pauses at one checkpoint,
    # the checkpoint keeps the last one's interrupt only (docs/agent-server.md).
    (run,) = client.runs.list(thread)
    replayed = parts(client.runs.join_stream(thread, run["run_id"], last_event_id="-1"))
    again = [p.id for p in replayed if p.event not in ("metadata", "end")]
    assert again == [i for i in ids if i in again] and again[-3:] == ids[-3:]
    assert len(again) == len(ids) - 2, "all but the first pause's interrupt and its values"


def telling_twice() -> StateGraph:
    """`asking_twice`, telling the client (custom) before each question."""

    def ask(state: Log) -> dict[str, Any]:
        tell = get_stream_writer()
        tell("asking first")
        first = interrupt("first?")
        tell("asking second")
        return {"log": [f"{first}, then {interrupt('second?')}"]}

    return one_node(Log, "ask", ask)


def test_answers_streamed_without_a_takeover_say_nothing_was_superseded(
    make_app: Callable[..., keel.App],
) -> None:
    """The resumed node's execution replaces the chunks of the one before the pause, which an
    answer's stream (from now) never sent: no `keel/superseded` marker, kept for a takeover
    that re-ran chunks the same stream had sent."""
    app = make_app(lease_ttl=5)
    app.workflow("telling")(telling_twice)
    with serving(app) as served:
        client = served.client
        thread = new_thread(served)
        modes = ["values", "updates", "custom"]
        streamed = [
            parts(client.runs.stream(thread, "telling", input={"log": []}, stream_mode=modes)),
            parts(
                client.runs.stream(thread, "telling", command={"resume": "A"}, stream_mode=modes)
            ),
            parts(
                client.runs.stream(thread, "telling", command={"resume": "B"}, stream_mode=modes)
            ),
        ]
        assert client.threads.get_state(thread)["values"]["log"] == ["A, then B"]
    told = [[p.data for p in s if p.event == "custom"] for s in streamed]
    assert told[0] == ["asking first"] and "asking second" in told[1]
    assert [p.event for s in streamed for p in s if p.event.startswith("keel/")] == []


def test_no_input_on_a_paused_thread_asks_again_and_its_answer_finishes_it(svc: Served) -> None:
    """The new run paused where it began, on the ended run's checkpoint: its stream said
    nothing, and once answered it started over, asked again, found its wait decided and was
    queued again, for ever (the thread busy, the database written 50 times a second)."""
    client = svc.client
    modes = ["values", "updates"]
    thread = new_thread(svc)
    streamed = [
        parts(client.runs.stream(thread, "ask", input={"question": "q?"}, stream_mode=modes)),
        parts(client.runs.stream(thread, "ask", input=None, stream_mode=modes)),
        parts(client.runs.stream(thread, "ask", command={"resume": "yes"}, stream_mode=modes)),
    ]
    turns: list[Any] = [{"question": "q?"}, None, Command(resume="yes")]
    assert [data_parts(s) for s in streamed] == langgraph_parts(asking, turns, modes)
    assert client.threads.get(thread)["status"] == "idle"
    assert client.threads.get_state(thread)["values"]["answer"] == "yes"


def test_a_goto_streams_the_state_it_starts_from_and_its_node_as_in_langgraph(
    svc: Served,
) -> None:
    """A run whose first checkpoint follows another run's (`Command(goto=...)`): its stream
    sent only its final values (nothing came before its first checkpoint to tell)."""
    client = svc.client
    modes = ["values", "updates"]
    thread = new_thread(svc)
    first = parts(client.runs.stream(thread, "steps", input={"log": []}, stream_mode=modes))
    goto = parts(client.runs.stream(thread, "steps", command={"goto": "last"}, stream_mode=modes))
    turns: list[Any] = [{"log": []}, Command(goto="last")]
    theirs = langgraph_parts(three_steps, turns, modes)
    assert data_parts(first) == theirs[0]
    # The goto'd node's `updates` is not told: its writes sit on the other run's checkpoint,
    # whose state names no task for them (docs/agent-server.md).
    assert data_parts(goto) == [p for p in theirs[1] if p[0] == "values"]


def test_an_empty_command_is_no_command_as_langgraph_sdk_sends_resume_none(
    svc: Served,
) -> None:
    """langgraph-sdk drops a Command's None fields: `Command(resume=None)` arrives as `{}`,
    which was refused (400); langgraph-api runs the paused node again, which pauses again."""
    client = svc.client
    thread = new_thread(svc)
    client.runs.wait(thread, "ask", input={"question": "q?"})
    answer = httpx.post(
        f"{svc.url}/threads/{thread}/runs/wait",
        json={"assistant_id": "ask", "command": {}},
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["__interrupt__"][0]["value"] == {"question": "q?"}
    assert client.threads.get(thread)["status"] == "interrupted"


def test_the_events_root_is_named_after_the_graph_as_on_langgraph_api(svc: Served) -> None:
    streamed = parts(
        svc.client.runs.stream(new_thread(svc), "steps", input={"log": []}, stream_mode="events")
    )
    roots = [p.data for p in streamed if p.event == "events" and not p.data.get("parent_ids")]
    assert roots and {r["name"] for r in roots} == {"steps"}


def test_a_failing_run_streams_its_committed_steps_then_the_error(svc: Served) -> None:
    streamed = parts(
        svc.client.runs.stream(new_thread(svc), "failing", input={"log": []}, stream_mode="updates")
    )
    assert [(p.event, p.data) for p in streamed[1:]] == [
        ("updates", {"ok": {"log": ["ok"]}}),
        ("error", {"error": "ValueError", "message": "boom"}),
        ("end", None),
    ]


def test_join_stream_resumes_after_any_event_id(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    GATES[thread] = threading.Event()
    modes = ["values", "updates"]
    seen = []
    for part in client.runs.stream(thread, "gated", input={"log": []}, stream_mode=modes):
        seen.append(part)
        if part.event == "updates" and "before" in part.data:
            break  # the client goes away mid-run; the run goes on
    run_id = seen[0].data["run_id"]
    assert client.runs.get(thread, run_id)["status"] == "running"
    GATES[thread].set()
    rest = parts(client.runs.join_stream(thread, run_id, last_event_id=seen[-1].id))
    assert rest[-1].event == "end" and all(p.event != "metadata" for p in rest)
    whole = seen + rest
    assert data_parts(whole) == langgraph_parts(gated, [{"log": []}], modes)[0]
    ids = [p.id for p in whole]
    assert len(ids) == len(set(ids))
    # From every event's id, the stream goes on with exactly the events after it.
    for n, part in enumerate(whole[:-1]):
        again = parts(client.runs.join_stream(thread, run_id, last_event_id=part.id))
        assert [p.id for p in again[:-1]] == ids[n + 1 : -1], part.id
        assert data_parts(again) == data_parts(whole[n + 1 :])
    # `-1`, as useStream rejoins a run: from the start.
    # useStream's rejoin gets the `metadata` event first, as on langgraph-api.
    replayed = parts(client.runs.join_stream(thread, run_id, last_event_id="-1"))
    assert replayed[0].event == "metadata" and replayed[0].data["run_id"] == run_id
    assert [p.id for p in replayed[1:-1]] == [p.id for p in whole[1:-1]]
    # Without an id: from now on (here: nothing more, the run has ended).
    assert [p.event for p in parts(client.runs.join_stream(thread, run_id))] == ["end"]
    # In another mode than the run's.
    only = parts(
        client.runs.join_stream(thread, run_id, stream_mode="updates", last_event_id=ids[0])
    )
    assert {p.event for p in only} == {"updates", "end"}
    # An id naming no place a run has (its checkpoint part is no checkpoint id): 400, on the
    # run's stream and on the thread's, not a stream resumed somewhere made up.
    checkpoint = next(i for i in ids if not i.startswith("-")).split("/")[0]
    for url, bad in [
        (f"/threads/{thread}/runs/{run_id}/stream", "x/1"),
        (f"/threads/{thread}/runs/{run_id}/stream", f"g{checkpoint[1:]}/1"),
        (f"/threads/{thread}/runs/{run_id}/stream", "abc"),
        (f"/threads/{thread}/stream", f"{run_id}/x/1"),
    ]:
        headers = {**bearer(ADMIN), "Last-Event-ID": bad}
        answer = httpx.get(svc.url + url, headers=headers, timeout=30)
        assert (answer.status_code, answer.json()["error"]) == (400, "invalid_id"), (url, bad)


# -- strategies, cancel, refusals ----------------------------------------------------------------


def test_a_second_answer_to_the_same_pause_is_409(svc: Served) -> None:
    # A busy thread's `reject` and new input on a paused thread: test_agent_server_paused.py.
    client = svc.client
    thread = new_thread(svc)
    client.runs.wait(thread, "ask", input={"question": "a"})
    client.runs.create(thread, "ask", command={"resume": "first"})
    with pytest.raises(ConflictError) as refused:
        client.runs.create(thread, "ask", command={"resume": "second"})
    # Which 409 depends on how far the first answer got: recorded, its run resumed, or ended.
    why = refused.value.body["error"]  # type: ignore[index]
    assert why in ("decision_conflict", "no_pending_wait", "run_finished"), why
    assert len(client.runs.list(thread)) == 1


def test_cancel_stops_a_running_run_at_its_next_step(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    GATES[thread] = threading.Event()
    run = client.runs.create(thread, "gated", input={"log": []})
    for part in client.runs.join_stream(
        thread, run["run_id"], stream_mode="updates", last_event_id="-/0"
    ):
        if part.event == "updates" and "before" in part.data:
            break
    assert client.runs.cancel(thread, run["run_id"]) is None  # 202: asked
    GATES[thread].set()
    final = client.runs.join(thread, run["run_id"])
    assert final["log"] == ["before", "held"]  # its step boundary; `after` never ran
    assert client.runs.get(thread, run["run_id"])["status"] == "interrupted"
    with pytest.raises(ConflictError):
        client.runs.cancel(thread, run["run_id"])  # already ended


def test_a_stream_whose_client_goes_away_cancels_its_run_if_asked(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    GATES[thread] = threading.Event()
    stream = client.runs.stream(
        thread, "gated", input={"log": []}, stream_mode="updates", on_disconnect="cancel"
    )
    run_id = ""
    for part in stream:
        if part.event == "metadata":
            run_id = part.data["run_id"]
        if part.event == "updates":
            break
    stream.close()  # the client goes away mid-run

    def cancel_asked() -> bool:
        return bool(svc.app.get_run(run_id).run["cancel_requested"])

    wait_until(cancel_asked, 30, "the server to cancel the run of a stream left")
    GATES[thread].set()
    assert client.runs.join(thread, run_id)["log"] == ["before", "held"]
    assert client.runs.get(thread, run_id)["status"] == "interrupted"


@pytest.mark.parametrize("how", ["wait", "join"])
def test_a_wait_or_join_whose_client_goes_away_cancels_its_run_if_asked(
    svc: Served, how: str
) -> None:
    """`runs.wait(on_disconnect="cancel")` and `runs.join(cancel_on_disconnect=True)`: the
    client leaving before the run ended cancels it (at its next step boundary); a token that
    may only read cannot ask a join to cancel."""
    client = svc.client
    thread = new_thread(svc)
    GATES[thread] = threading.Event()
    wait_body = {"assistant_id": "gated", "input": {"log": []}, "on_disconnect": "cancel"}
    if how == "join":
        run_id = client.runs.create(thread, "gated", input={"log": []})["run_id"]
        reader = {"x-api-key": READER}
        url = f"{svc.url}/threads/{thread}/runs/{run_id}/join?cancel_on_disconnect=true"
        assert httpx.get(url, headers=reader).status_code == 403
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        if how == "wait":
            httpx.post(
                f"{svc.url}/threads/{thread}/runs/wait",
                json=wait_body,
                headers={"x-api-key": ADMIN},
                timeout=1.0,
            )
        else:
            httpx.get(url, headers={"x-api-key": ADMIN}, timeout=1.0)
    (run,) = client.runs.list(thread)

    def cancel_asked() -> bool:
        return bool(svc.app.get_run(run["run_id"]).run["cancel_requested"])

    wait_until(cancel_asked, 30, "the server to cancel the run its client left")
    GATES[thread].set()
    assert client.runs.join(thread, run["run_id"])["log"] == ["before", "held"]
    assert client.runs.get(thread, run["run_id"])["status"] == "interrupted"


def test_cancel_with_rollback_discards_what_the_run_checkpointed(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    client.runs.wait(thread, "chat", input=say("kept"))
    before = client.threads.get_state(thread)
    paused = new_thread(svc)
    client.runs.wait(paused, "ask", input={"question": "q"})
    (run,) = client.runs.list(paused)
    ended = client.runs.cancel(paused, run["run_id"], wait=True, action="rollback")
    assert ended == {}  # nothing of it is left
    assert client.runs.get(paused, run["run_id"])["status"] == "interrupted"
    assert client.threads.get_state(paused)["values"] == {}
    assert svc.app.get_run(run["run_id"]).run["termination_reason"] == "rolled_back"
    # The other thread is untouched; an interrupt-cancel keeps what a run wrote.
    assert client.threads.get_state(thread) == before
    again = client.runs.create(paused, "ask", input={"question": "r"})
    client.runs.join(paused, again["run_id"])
    client.runs.cancel(paused, again["run_id"], wait=True)
    assert client.threads.get_state(paused)["values"]["question"] == "r"


def test_a_finished_run_is_deleted_and_runs_belong_to_their_thread(svc: Served) -> None:
    client = svc.client
    thread, other = new_thread(svc), new_thread(svc)
    run = client.runs.create(thread, "chat", input=say("x"))
    client.runs.join(thread, run["run_id"])
    with pytest.raises(NotFoundError):
        client.runs.delete(other, run["run_id"])
    store = svc.app.aio.runtime.store
    assert svc.app.aio.runtime.portal.call(store.events_after(run["run_id"]))
    state = client.threads.get_state(thread)
    client.runs.delete(thread, run["run_id"])
    # The run and its timeline are gone; the thread's checkpoints, and so its state, stay.
    with pytest.raises(NotFoundError):
        client.runs.get(thread, run["run_id"])
    assert client.runs.list(thread) == []
    assert svc.app.aio.runtime.portal.call(store.events_after(run["run_id"])) == []
    assert client.threads.get_state(thread) == state
    paused = new_thread(svc)
    client.runs.wait(paused, "ask", input={"question": "q"})
    (waiting,) = client.runs.list(paused)
    with pytest.raises(ConflictError) as refused:
        client.runs.delete(paused, waiting["run_id"])
    assert refused.value.body["error"] == "run_unfinished"  # type: ignore[index]
    assert client.runs.get(paused, waiting["run_id"])["run_id"] == waiting["run_id"]
    run = client.runs.create(thread, "chat", input=say("y"))
    client.runs.join(thread, run["run_id"])
    with pytest.raises(NotFoundError):
        client.runs.get(other, run["run_id"])
    with pytest.raises(NotFoundError):
        client.runs.create("no-such-thread", "chat", input=say("x"))
    with pytest.raises(NotFoundError):
        client.runs.create(thread, "no-such-graph", input=say("x"))
    made = client.runs.wait("made-here", "chat", input=say("x"), if_not_exists="create")
    assert made["turns"] == 1 and client.threads.get("made-here")["status"] == "idle"


def test_what_keel_cannot_do_is_refused_with_a_reason(served: Served) -> None:
    client = served.client
    thread = new_thread(served)
    for options, word in [
        ({"stream_mode": ["values", "telepathy"]}, "telepathy"),
    ]:
        with pytest.raises(UnprocessableEntityError) as refused:
            client.runs.create(thread, "chat", input=say("x"), **options)
        assert word in refused.value.body["message"]  # type: ignore[index]
    # The modes a live channel would need are accepted: nothing is sent for them.
    run = client.runs.create(thread, "chat", input=say("x"), stream_mode=["messages-tuple"])
    assert run["kwargs"]["stream_mode"] == ["messages-tuple"]
    assert len(client.runs.list(thread)) == 1


# -- stateless runs -----------------------------------------------------------------------------


def test_stateless_runs_get_a_thread_of_their_own(svc: Served) -> None:
    client = svc.client
    final = client.runs.wait(None, "chat", input=say("solo"))
    assert [m["content"] for m in final["messages"]] == ["solo", "echo: solo"]
    streamed = parts(client.runs.stream(None, "steps", input={"log": []}, stream_mode="updates"))
    assert data_parts(streamed) == langgraph_parts(three_steps, [{"log": []}], ["updates"])[0]
    run_id = streamed[0].data["run_id"]
    # Deleted with its thread once it finished (on_completion defaults to delete)...
    gone = svc.app.get_run(run_id).run["thread_id"]
    with pytest.raises(NotFoundError):
        client.threads.get(gone)
    # ... or kept.
    kept = client.runs.create(None, "chat", input=say("keep"), on_completion="keep")
    assert kept["thread_id"] != gone
    assert client.runs.join(kept["thread_id"], kept["run_id"])["turns"] == 1
    assert client.threads.get(kept["thread_id"])["status"] == "idle"


def test_runs_are_created_in_a_batch_and_cancelled_many_at_once(served: Served) -> None:
    client = served.client
    # No worker yet: the batch's runs wait, pending, for one.
    batch = client.runs.create_batch(
        [
            {"assistant_id": "steps", "input": {"log": []}, "on_completion": "keep"},
            {"assistant_id": "chat", "input": say("hi"), "on_completion": "keep"},
        ]
    )
    assert [r["status"] for r in batch] == ["pending", "pending"]
    assert len({r["thread_id"] for r in batch}) == 2
    waiting = [new_thread(served) for _ in range(2)]
    held = [client.runs.create(t, "steps", input={"log": []}) for t in waiting]
    # By thread and ids: the named run only.
    assert client.runs.cancel_many(thread_id=waiting[0], run_ids=[held[0]["run_id"]]) is None
    assert client.runs.get(waiting[0], held[0]["run_id"])["status"] == "interrupted"
    assert client.runs.get(waiting[1], held[1]["run_id"])["status"] == "pending"
    with pytest.raises(NotFoundError):  # nothing left to cancel there
        client.runs.cancel_many(thread_id=waiting[0], run_ids=[held[0]["run_id"]])
    # By status: every pending run, the batch's too.
    client.runs.cancel_many(status="pending")
    assert client.runs.get(waiting[1], held[1]["run_id"])["status"] == "interrupted"
    assert {client.runs.get(r["thread_id"], r["run_id"])["status"] for r in batch} == {
        "interrupted"
    }
    with pytest.raises(NotFoundError):
        client.runs.cancel_many(status="all")
    # A new batch runs to its end once a worker is there.
    (again,) = client.runs.create_batch(
        [{"assistant_id": "steps", "input": {"log": []}, "on_completion": "keep"}]
    )
    with live_worker(served.app):
        assert client.runs.join(again["thread_id"], again["run_id"])["log"] == ["first", "last"]


# -- a thread's stream ----------------------------------------------------------------------------


def take(
    stream: Any, count: Callable[[list[Any]], bool], got: list[Any] | None = None
) -> list[Any]:
    """The parts of a stream that does not end on its own, up to the first list `count`
    accepts (read in a thread into `got`, given up after 60 s)."""
    got = [] if got is None else got
    done = threading.Event()

    def read() -> None:
        try:
            for part in stream:
                got.append(part)
                if count(got):
                    break
        finally:
            done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(60), [(p.event, p.data) for p in got]
    return got


def runs_done(n: int) -> Callable[[list[Any]], bool]:
    return lambda got: sum(p.event == "metadata" and "status" in p.data for p in got) >= n


def test_a_threads_stream_follows_its_runs_one_after_another(svc: Served) -> None:
    client = svc.client
    thread = new_thread(svc)
    before = client.runs.create(thread, "gated", input={"log": []})
    client.runs.join(thread, before["run_id"])
    GATES[thread] = threading.Event()
    first = client.runs.create(thread, "gated", input={"log": []}, stream_mode=["updates"])
    held = ["before", "held", "after", "before"]
    at_hold = lambda: client.threads.get_state(thread)["values"].get("log") == held  # noqa: E731
    wait_until(at_hold, 30, "the run to wait at its gate")
    seen: list[Any] = []

    def follow() -> None:
        take(client.threads.join_stream(thread), runs_done(2), seen)

    reader = threading.Thread(target=follow)
    reader.start()
    # The stream starts with the run under way (not the one that ended before it).
    wait_until(lambda: len(seen) > 0 or not reader.is_alive(), 30, "the stream to start")
    GATES[thread].set()
    client.runs.join(thread, first["run_id"])
    second = client.runs.create(thread, "gated", input={"log": []}, stream_mode=["updates"])
    reader.join(60)
    runs = [p.data["run_id"] for p in seen if p.event == "metadata"]
    assert runs == [first["run_id"]] * 2 + [second["run_id"]] * 2
    assert seen[0].data == {"run_id": first["run_id"], "attempt": 1}
    assert seen[-1].data == {"status": "run_done", "run_id": second["run_id"]}
    # Each run in the modes it was created with: from now for the first, whole for the second.
    cut = [p.event for p in seen].index("metadata", 2)
    assert data_parts(seen[:cut]) == [
        ("updates", {"hold": {"log": ["held"]}}),
        ("updates", {"after": {"log": ["after"]}}),
    ]
    assert data_parts(seen[cut:]) == langgraph_parts(gated, [{"log": []}], ["updates"])[0]
    ids = [p.id for p in seen]
    assert len(ids) == len(set(ids))
    assert all(i.startswith(first["run_id"]) for i in ids[:cut]), ids
    # Reconnecting after any event: exactly the events after it, across the runs.
    for n in (0, 2, cut - 1, cut):
        again = take(
            client.threads.join_stream(thread, last_event_id=ids[n]), runs_done(2 - (n >= cut))
        )
        assert [p.id for p in again] == ids[n + 1 :], n
    # `-1`: every run of the thread from its start.
    whole = take(client.threads.join_stream(thread, last_event_id="-1"), runs_done(3))
    assert [p.data["run_id"] for p in whole if p.event == "metadata"][:2] == [before["run_id"]] * 2
    assert [p.id for p in whole][-len(ids) + cut :] == ids[cut:]
    # Lifecycle only: the runs' framing.
    framed = take(
        client.threads.join_stream(thread, stream_mode="lifecycle", last_event_id="-1"),
        runs_done(3),
    )
    assert {p.event for p in framed} == {"metadata"} and len(framed) == 6
    with pytest.raises(UnprocessableEntityError):
        parts(client.threads.join_stream(thread, stream_mode="telepathy"))  # type: ignore[arg-type]
    with pytest.raises(NotFoundError):
        parts(client.threads.join_stream(str(uuid.uuid4())))


def test_checkpoints_and_message_chunks_name_their_run_and_thread(svc: Served) -> None:
    client = svc.client
    thread = str(client.threads.create(metadata={"owner": "ada"})["thread_id"])
    runs = [client.runs.create(thread, "chat", input=say(t), metadata={"m": 1}) for t in "ab"]
    for run in runs:
        client.runs.join(thread, run["run_id"])
    history = client.threads.get_history(thread, limit=100)
    # As langgraph dev writes them: the run, the thread, its graph and assistant, its owner.
    for state in history:
        meta = state["metadata"]
        assert meta["thread_id"] == thread and meta["run_id"] in [r["run_id"] for r in runs]
        assert (meta["graph_id"], meta["assistant_id"]) == ("chat", assistant_id_of("chat"))
        assert (meta["owner"], meta["m"]) == ("ada", 1)
    assert client.threads.get_state(thread)["metadata"]["run_id"] == runs[1]["run_id"]
    for run in runs:
        mine = client.threads.get_history(thread, limit=100, metadata={"run_id": run["run_id"]})
        assert [h["checkpoint_id"] for h in mine] == [
            h["checkpoint_id"] for h in history if h["metadata"]["run_id"] == run["run_id"]
        ]
        assert len(mine) == 3  # its input, the step that takes it in, the reply
    assert len(client.threads.get_history(thread, limit=100, metadata={"thread_id": thread})) == 6
