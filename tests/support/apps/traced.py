"""A traced app for worker processes: two nodes with an effect each, then a last node.

`draft` books a slot (effect `book`), `send` delivers (effect `deliver`), `finish` ends. Every
real performance of an effect appends a line to $TRACED_WORLD (what the outside world saw).
With $KEEL_TEST_SPANS set, the process exports its spans there as JSON lines
(tests/support/traces.py), as an app configures OpenTelemetry in its own module.
"""

from __future__ import annotations

import json
import os
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

WORKFLOW = "traced"


class State(TypedDict, total=False):
    to: str
    slot: str
    sent: str


def _world(effect: str, key: str) -> None:
    with open(os.environ["TRACED_WORLD"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"effect": effect, "key": key}) + "\n")


@keel.effect("book")
def book(to: str, *, idempotency_key: str) -> str:
    _world("book", idempotency_key)
    return f"slot-for-{to}"


@keel.effect("deliver")
def deliver(to: str, slot: str, *, idempotency_key: str) -> str:
    _world("deliver", idempotency_key)
    return f"sent-to-{to}"


def draft(state: State) -> State:
    return {"slot": book(state["to"])}


def send(state: State) -> State:
    return {"sent": deliver(state["to"], state["slot"])}


def finish(state: State) -> State:
    return {}


def build() -> StateGraph:
    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("send", send)
    g.add_node("finish", finish)
    g.add_edge(START, "draft")
    g.add_edge("draft", "send")
    g.add_edge("send", "finish")
    g.add_edge("finish", END)
    return g


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(name)
    if os.environ.get("KEEL_TEST_SPANS"):
        from tests.support.traces import export_to

        export_to(os.environ["KEEL_TEST_SPANS"])
    built = keel.App(os.environ.get("KEEL_DATABASE_URL"))
    built.workflow(WORKFLOW)(build)
    globals()["app"] = built
    return built
