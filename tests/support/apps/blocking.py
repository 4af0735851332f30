"""A workflow whose async node blocks its worker's event loop (`time.sleep` in an `async def`)
for three lease TTLs, run by real `keel worker` processes (`tests.support.apps.blocking:app`,
with `max_attempts=2`): no process dies, yet every lease lapses and is taken over.

Env: KEEL_DATABASE_URL, KEEL_LEASE_TTL (the block lasts 3 of them).
"""

from __future__ import annotations

import os
import time
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

MAX_ATTEMPTS = 2


class S(TypedDict, total=False):
    x: int


async def block(state: S) -> dict[str, Any]:
    time.sleep(3 * float(os.environ.get("KEEL_LEASE_TTL", "3")))  # noqa: ASYNC251 (the bug)
    return {"x": 1}


def blocking() -> StateGraph:
    g = StateGraph(S)
    g.add_node("block", block)
    g.add_edge(START, "block")
    g.add_edge("block", END)
    return g


def register(app: keel.App) -> keel.App:
    app.workflow("blocking")(blocking)
    return app


def __getattr__(name: str) -> keel.App:
    # Built on first use: importing the module (the test does, for `register`) opens nothing.
    if name == "app":
        globals()["app"] = built = register(keel.App(max_attempts=MAX_ATTEMPTS))
        return built
    raise AttributeError(name)
