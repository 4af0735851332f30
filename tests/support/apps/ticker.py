"""A workflow started by a per-second cron (`*/1 * * * * *`), declared with the workflow, for
the schedule process tests: every `keel worker` of it upserts the schedule and fires ticks.

Env: KEEL_DATABASE_URL; TICKER_CATCH_UP (latest, all or none; default latest).
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

app = keel.App()


class Tick(TypedDict, total=False):
    n: int


def build() -> StateGraph:
    def count(state: Tick) -> dict[str, Any]:
        return {"n": state.get("n", 0) + 1}

    g = StateGraph(Tick)
    g.add_node("count", count)
    g.add_edge(START, "count")
    g.add_edge("count", END)
    return g


app.workflow(
    "ticker",
    schedule={
        "cron": "*/1 * * * * *",
        "input": {"n": 0},
        "catch_up": os.environ.get("TICKER_CATCH_UP", "latest"),
        # Every tick must fire for the test to count them: a run still queued is no reason to
        # skip one here.
        "overlap": "allow",
    },
)(build)
