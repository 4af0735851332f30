"""An app for completion webhooks (KEEL_WEBHOOK_SECRET and KEEL_WEBHOOK_ALLOW_HOSTS set by the
test): `echo` ends at once; `ask` pauses on an interrupt and ends with the answer."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import keel
from tests.support.graphs import echo_graph

app = keel.App()
app.workflow("echo")(echo_graph)


class AskState(TypedDict, total=False):
    answer: Any


def _ask(state: AskState) -> AskState:
    return {"answer": interrupt({"question": "go?"})}


@app.workflow("ask")
def ask() -> StateGraph:
    g = StateGraph(AskState)
    g.add_node("ask", _ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g
