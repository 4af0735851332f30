"""An App whose database URL is fixed in code, the README's own pattern: `keel chaos` cannot
hand its workers a throwaway database, and must say so in one line."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

import keel


class State(TypedDict, total=False):
    text: str


app = keel.App(f"sqlite:///{Path(tempfile.gettempdir()) / 'keel-fixed-url' / 'app.db'}")


@app.workflow("echo")
def echo() -> StateGraph:
    graph = StateGraph(State)
    graph.add_node("say", lambda state: {"text": "said"})
    graph.add_edge(START, "say")
    graph.add_edge("say", END)
    return graph
