"""An app whose workflow's graph has no edge from START: importing it raises InvalidWorkflow,
so `keel submit` and `keel worker` refuse it at once instead of looping on its runs."""

from __future__ import annotations

from typing import TypedDict

from langgraph.graph import END, StateGraph

import keel


class State(TypedDict, total=False):
    text: str


app = keel.App()


@app.workflow("no-start")
def no_start() -> StateGraph:
    g = StateGraph(State)
    g.add_node("only", lambda state: {})
    g.add_edge("only", END)
    return g
