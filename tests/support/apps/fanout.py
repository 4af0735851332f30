"""A worker app for runtime/test_starvation: one run fans out into many sync nodes, each
with an effect. The provider is a file (one line per delivery), so the test counts what the
world saw ($FANOUT_DELIVERIES).
"""

from __future__ import annotations

import operator
import os
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

import keel

app = keel.App()


@keel.effect("note")
def note(i: int, *, idempotency_key: str) -> int:
    with open(os.environ["FANOUT_DELIVERIES"], "a") as fh:
        fh.write(f"{idempotency_key}\n")
    return i


class FanState(TypedDict, total=False):
    n: int
    out: Annotated[list[Any], operator.add]


def build() -> StateGraph:
    def fan(state: FanState) -> list[Send]:
        return [Send("work", {"i": i}) for i in range(state["n"])]

    def work(state: dict[str, int]) -> dict[str, Any]:
        return {"out": [note(state["i"])]}

    g = StateGraph(FanState)
    g.add_node("work", work)
    g.add_conditional_edges(START, fan, ["work"])
    g.add_edge("work", END)
    return g


app.workflow("fanout")(build)
