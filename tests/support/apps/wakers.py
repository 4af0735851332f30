"""A workflow whose node sleeps, then stops after the wake until told to go on, for the test
that kills a `keel worker` between a sleep's wake and the end of its node.

`wake` appends a line to $WAKERS_MARKS at its start and after its sleep, then holds (a blocking
wait) while $WAKERS_RELEASE does not exist. Env: KEEL_DATABASE_URL.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

app = keel.App()


class Wake(TypedDict, total=False):
    seconds: float
    done: bool


def _mark(line: str) -> None:
    with Path(os.environ["WAKERS_MARKS"]).open("a") as marks:
        marks.write(line + "\n")


def wake(state: Wake) -> dict[str, Any]:
    _mark("start")
    keel.sleep(state["seconds"])
    _mark("woke")
    while not Path(os.environ["WAKERS_RELEASE"]).exists():
        time.sleep(0.1)  # a node still busy after its wake: the worker is killed here
    return {"done": True}


@app.workflow("waker")
def waker() -> StateGraph:
    g = StateGraph(Wake)
    g.add_node("wake", wake)
    g.add_edge(START, "wake")
    g.add_edge("wake", END)
    return g
