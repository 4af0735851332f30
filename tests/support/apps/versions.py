"""One workflow in three versions, for the version-upgrade tests.

`order`: prepare -> review (a manager's approval) -> ship, recording which version shipped.
Version 2 has the same nodes (a compatible change: `ship` says "v2"); version 3 renamed
`review` to `approve`, so a run paused in `review` cannot move to it.

`register_v1(app)` registers version 1 only (the old deployment); `register_new(app)` versions
2 and 3 side by side (the new one); `register_edited_v1(app)` version 1 with `review` renamed
under the same version (a deploy that forgot to bump it). `--app
tests.support.apps.versions:fresh_app` builds a new App of the new deployment on
$KEEL_DATABASE_URL at each use (the CLI tests).
"""

from __future__ import annotations

import os
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

WORKFLOW = "order"


class Order(TypedDict, total=False):
    order: str
    decision: str
    shipped_by: str


def prepare(state: Order) -> Order:
    return {"order": state["order"].strip()}


def review(state: Order) -> Order:
    return {"decision": keel.approval("manager", payload={"order": state["order"]}).decision}


def _ship(version: str) -> Any:
    def ship(state: Order) -> Order:
        return {"shipped_by": version if state["decision"] == "approved" else "nobody"}

    return ship


def _graph(version: str, review_node: str) -> StateGraph:
    g = StateGraph(Order)
    g.add_node("prepare", prepare)
    g.add_node(review_node, review)
    g.add_node("ship", _ship(version))
    g.add_edge(START, "prepare")
    g.add_edge("prepare", review_node)
    g.add_edge(review_node, "ship")
    g.add_edge("ship", END)
    return g


def register_v1(app: keel.App) -> keel.App:
    app.workflow(WORKFLOW, version="1")(lambda: _graph("v1", "review"))
    return app


def register_edited_v1(app: keel.App) -> keel.App:
    """Version 1 edited in place: `review` renamed to `signoff`, the version left at "1" (what
    a deploy that forgot to bump the version brings)."""
    app.workflow(WORKFLOW, version="1")(lambda: _graph("v1", "signoff"))
    return app


def register_new(app: keel.App) -> keel.App:
    app.workflow(WORKFLOW, version="2")(lambda: _graph("v2", "review"))
    app.workflow(WORKFLOW, version="3")(lambda: _graph("v3", "approve"))
    return app


def __getattr__(name: str) -> Any:
    if name == "fresh_app":
        return register_new(keel.App(os.environ.get("KEEL_DATABASE_URL")))
    raise AttributeError(name)
