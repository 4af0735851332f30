"""An app whose workers give up at start inside a chaos cell (as one missing a credential
would): `keel chaos` must stop at once with the worker's last line, not wait out the cell."""

from __future__ import annotations

import os
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

import keel

if os.environ.get("KEEL_CHAOS_SMTP_URL"):  # set in a cell's worker only
    raise SystemExit("no SMTP password in this environment: set MAIL_PASSWORD")


class State(TypedDict, total=False):
    text: str


app = keel.App()


@app.workflow("echo")
def echo() -> StateGraph:
    graph = StateGraph(State)
    graph.add_node("say", lambda state: {"text": "said"})
    graph.add_edge(START, "say")
    graph.add_edge("say", END)
    return graph
