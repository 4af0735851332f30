"""An app whose node logs, performs an effect, and (on request) fails with a message full of
secrets: what the log tests run in real worker and server processes.

The App reads its database from $KEEL_DATABASE_URL when first imported as `app`.
"""

from __future__ import annotations

import logging
import os
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

WORKFLOW = "observed"
# Known secret strings: none of them may appear in any output of a Keel process.
DB_PASSWORD = "pw-Zq81-s3cret"
API_TOKEN = "observed-lX1IijRUN5xgPNeH9P8LI7ZFeAdmBYeQOD6bvWf6rdA"
SLACK_SECRET = "slk-Wm42-s3cret"
SECRET_URL = f"postgresql://keel:{DB_PASSWORD}@db.internal:5432/keel"
log = logging.getLogger("observed.nodes")


class State(TypedDict, total=False):
    to: str
    fail: bool


@keel.effect("notify")
def notify(to: str, *, idempotency_key: str) -> dict[str, str]:
    return {"to": to}


def work(state: State) -> State:
    log.info("calling %s with 'Authorization: Bearer %s'", SECRET_URL, API_TOKEN)
    notify(state["to"])
    return {}


def finish(state: State) -> State:
    if state.get("fail"):
        raise RuntimeError(f"provider refused {SECRET_URL} token={API_TOKEN} ({SLACK_SECRET})")
    return {}


def build() -> StateGraph:
    g = StateGraph(State)
    g.add_node("work", work)
    g.add_node("finish", finish)
    g.add_edge(START, "work")
    g.add_edge("work", "finish")
    g.add_edge("finish", END)
    return g


def make() -> keel.App:
    built = keel.App(os.environ.get("KEEL_DATABASE_URL"))
    built.workflow(WORKFLOW)(build)
    return built


def __getattr__(name: str) -> Any:
    if name == "app":
        globals()["app"] = made = make()
        return made
    raise AttributeError(name)
