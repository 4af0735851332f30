"""An app whose `charge` graph (tests.support.graphs.charge_graph) can be changed after a run,
for `keel runs replay`: $REPLAY_CHANGE is read when the graph is built (`rename`: the route to
the charge goes to a node named `pay`; `amount`: the charge's amount changes), and the charge
goes to the HTTP sink at $REPLAY_SINK_URL."""

from __future__ import annotations

import os
from typing import Any

from langgraph.graph import StateGraph

import keel
from tests.support.graphs import charge_graph, http_charge

WORKFLOW = "charge"


def graph() -> StateGraph:
    change = os.environ.get("REPLAY_CHANGE", "")
    charge = http_charge(os.environ.get("REPLAY_SINK_URL", "http://127.0.0.1:9"))
    changes: dict[str, Any] = {
        "": {},
        "rename": {"node": "pay"},
        "amount": {"amount": lambda a: a + 1},
    }
    return charge_graph(charge, **changes[change])


def build() -> keel.App:
    built = keel.App(os.environ.get("KEEL_DATABASE_URL"))
    built.workflow(WORKFLOW)(graph)
    return built


def __getattr__(name: str) -> keel.App:
    # A new App per import of the name: in-process CLI tests each get one on their database.
    if name == "fresh_app":
        return build()
    raise AttributeError(name)
