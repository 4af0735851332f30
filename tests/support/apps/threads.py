"""Workflows on threads for tests/processes/test_threads.py, run by real `keel worker` processes.

Every effect POSTs to an HTTP provider (`THREADS_SINK_URL`, a keel.testing.HttpSink) with Keel's
key as the body's `reference` and no Idempotency-Key header: the provider counts every POST,
so a second send would show as a second delivery. Each effect's reconciler asks the provider
(`GET <route>?reference=KEY`) before any retry.

- `chat`: a conversation turn (messages with `add_messages`): think -> post (the turn, once)
  -> reply. Message ids are deterministic, so a turn's state can be compared whole with
  LangGraph's own run of `chat_graph(stub)` on `InMemorySaver`.
- `ordered`: a run marks its start and its end at the provider (`/marks`); with `hold` it waits
  on an `interrupt()` between the two.
- `answered`: `ask` waits on a plain `interrupt()`, then posts the answer (`/answers`) and
  `close` marks the end (`/marks`); each node appends a line to `<THREADS_MARKERS>/ran.log`
  each time it gets past its interrupt, so a test counts the node's executions too.
- `steps`: four steps, an effect each (`/steps`); with `hold`, step 2 drops
  `<THREADS_MARKERS>/<run_id>.held` after its effect and waits for `<run_id>.go` before it
  returns, so a test knows the run is in the middle and decides when it goes on.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
from langchain_core.messages import AIMessage, AnyMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

import keel
from keel.core.context import current

EFFECT_TIMEOUT = 1.0
"""The effects' timeout: a new owner of a run whose worker died mid-call reconciles its key
this long (and a 1 s margin) after the call started."""
HOLD_AT = 2
"""The step of `steps` that waits for its `.go` marker when the run's input says `hold`."""
HOLD_LIMIT = 60.0


def _post(route: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(os.environ["THREADS_SINK_URL"] + route, json=body, timeout=10)
    response.raise_for_status()
    return dict(response.json())


def _find(route: str, key: str) -> dict[str, Any] | None:
    response = httpx.get(
        os.environ["THREADS_SINK_URL"] + route, params={"reference": key}, timeout=10
    )
    response.raise_for_status()
    found = response.json()["deliveries"]
    return {"ok": True, "delivery": found[0]["delivery"]} if found else None


def find_turn(thread: str, turn: int, text: str, *, idempotency_key: str) -> Any:
    return _find("/turns", idempotency_key)


@keel.effect("post_turn", reconcile=find_turn, timeout=EFFECT_TIMEOUT)
def post_turn(
    thread: str, turn: int, text: str, *, idempotency_key: str = keel.KEY
) -> dict[str, Any]:
    body = {"thread": thread, "turn": turn, "text": text, "reference": idempotency_key}
    return _post("/turns", body)


def find_mark(phase: str, i: int, *, idempotency_key: str) -> Any:
    return _find("/marks", idempotency_key)


@keel.effect("mark", reconcile=find_mark, timeout=EFFECT_TIMEOUT)
def mark(phase: str, i: int, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    return _post("/marks", {"phase": phase, "i": i, "reference": idempotency_key})


def find_step(name: str, step: int, *, idempotency_key: str) -> Any:
    return _find("/steps", idempotency_key)


@keel.effect("post_step", reconcile=find_step, timeout=EFFECT_TIMEOUT)
def post_step(name: str, step: int, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    return _post("/steps", {"name": name, "step": step, "reference": idempotency_key})


# -- chat ------------------------------------------------------------------------------------


class Chat(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    draft: str
    delivered: Annotated[list[int], operator.add]


Send = Callable[..., dict[str, Any]]


def user_message(turn: int, text: str) -> dict[str, Any]:
    """A turn's input message, with the id LangGraph's oracle run gives it too. (`type`, not
    `role`: Keel's input check refuses a role dict for a `list[AnyMessage]` field.)"""
    return {"type": "human", "content": text, "id": f"user-{turn}"}


def chat_graph(send: Send) -> StateGraph:
    """The chat turn with `send` as its effect (`post_turn`, or a stub for the oracle)."""

    def turn_of(state: Chat) -> int:
        return sum(1 for m in state["messages"] if m.type == "human")

    def think(state: Chat) -> Chat:
        text = str(state["messages"][-1].content)
        return {"draft": f"turn {turn_of(state)}: {text[::-1]}"}

    def post(state: Chat, config: RunnableConfig) -> Chat:
        thread = str(config["configurable"]["thread_id"])
        result = send(thread, turn_of(state), str(state["messages"][-1].content))
        return {"delivered": [int(result["delivery"])]}

    def reply(state: Chat) -> Chat:
        return {"messages": [AIMessage(content=state["draft"], id=f"ai-{turn_of(state)}")]}

    g = StateGraph(Chat)
    g.add_node("think", think)
    g.add_node("post", post)
    g.add_node("reply", reply)
    g.add_edge(START, "think")
    g.add_edge("think", "post")
    g.add_edge("post", "reply")
    g.add_edge("reply", END)
    return g


def chat() -> StateGraph:
    return chat_graph(post_turn)


# -- ordered -----------------------------------------------------------------------------------


class Ordered(TypedDict, total=False):
    i: int
    hold: bool
    answer: Any
    marks: Annotated[list[str], operator.add]


def ordered() -> StateGraph:
    def begin(state: Ordered) -> Ordered:
        mark("start", state["i"])
        return {"marks": [f"start {state['i']}"]}

    def gate(state: Ordered) -> Ordered:
        return {"answer": interrupt({"i": state["i"]}) if state.get("hold") else None}

    def finish(state: Ordered) -> Ordered:
        mark("end", state["i"])
        return {"marks": [f"end {state['i']}"]}

    g = StateGraph(Ordered)
    g.add_node("begin", begin)
    g.add_node("gate", gate)
    g.add_node("finish", finish)
    g.add_edge(START, "begin")
    g.add_edge("begin", "gate")
    g.add_edge("gate", "finish")
    g.add_edge("finish", END)
    return g


# -- answered --------------------------------------------------------------------------------


def find_answer(thread: str, answer: Any, *, idempotency_key: str) -> Any:
    return _find("/answers", idempotency_key)


@keel.effect("post_answer", reconcile=find_answer, timeout=EFFECT_TIMEOUT)
def post_answer(thread: str, answer: Any, *, idempotency_key: str = keel.KEY) -> dict[str, Any]:
    return _post("/answers", {"thread": thread, "answer": answer, "reference": idempotency_key})


class Answered(TypedDict, total=False):
    question: str
    note: str
    answer: Any
    marks: Annotated[list[str], operator.add]


APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT


def ran(node: str, answer: Any) -> None:
    """One line per execution of `node` past its interrupt, appended in one write (O_APPEND):
    lines of two processes (a killed worker and its successor) never mix."""
    line = json.dumps({"node": node, "run_id": current().run_id, "answer": answer}) + "\n"
    fd = os.open(Path(os.environ["THREADS_MARKERS"]) / "ran.log", APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def answered() -> StateGraph:
    def ask(state: Answered, config: RunnableConfig) -> Answered:
        answer = interrupt({"question": state["question"]})
        ran("ask", answer)
        post_answer(str(config["configurable"]["thread_id"]), answer)
        return {"answer": answer, "marks": ["asked"]}

    def close(state: Answered) -> Answered:
        ran("close", state["answer"])
        mark("closed", 0)
        return {"marks": ["closed"]}

    g = StateGraph(Answered)
    g.add_node("ask", ask)
    g.add_node("close", close)
    g.add_edge(START, "ask")
    g.add_edge("ask", "close")
    g.add_edge("close", END)
    return g


# -- steps -------------------------------------------------------------------------------------


class Steps(TypedDict, total=False):
    name: str
    hold: bool
    done: Annotated[list[str], operator.add]


def _held_here() -> None:
    """Say the run reached its held step, then wait until the test lets it go on."""
    folder = Path(os.environ["THREADS_MARKERS"])
    run_id = current().run_id
    (folder / f"{run_id}.held").touch()
    deadline = time.monotonic() + HOLD_LIMIT
    while not (folder / f"{run_id}.go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _step(k: int) -> Any:
    def node(state: Steps) -> Steps:
        post_step(state["name"], k)
        if k == HOLD_AT and state.get("hold"):
            _held_here()
        return {"done": [f"{state['name']} {k}"]}

    node.__name__ = f"step{k}"
    return node


STEPS = 4


def steps() -> StateGraph:
    g = StateGraph(Steps)
    previous = START
    for k in range(1, STEPS + 1):
        g.add_node(f"step{k}", _step(k))
        g.add_edge(previous, f"step{k}")
        previous = f"step{k}"
    g.add_edge(previous, END)
    return g


def register(app: keel.App) -> keel.App:
    app.workflow("chat", version="1")(chat)
    app.workflow("ordered", version="1")(ordered)
    app.workflow("steps", version="1")(steps)
    app.workflow("answered", version="1")(answered)
    return app


app = register(keel.App())
