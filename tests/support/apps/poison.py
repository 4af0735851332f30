"""A workflow whose one node kills its worker process every time (an OOM kill, a segfault),
run by real `keel worker` processes (`tests.support.apps.poison:app`, with `max_attempts=2`).

Env: KEEL_DATABASE_URL, POISON_MARKERS (a folder: each execution of the node appends a line to
`execs` before the process exits).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

MAX_ATTEMPTS = 2


class S(TypedDict, total=False):
    x: int


def die(state: S) -> dict[str, Any]:
    with (Path(os.environ["POISON_MARKERS"]) / "execs").open("a") as f:
        f.write("x\n")
    os._exit(137)  # what the kernel's OOM killer leaves of the process


def poison() -> StateGraph:
    g = StateGraph(S)
    g.add_node("die", die)
    g.add_edge(START, "die")
    g.add_edge("die", END)
    return g


def register(app: keel.App) -> keel.App:
    app.workflow("poison")(poison)
    return app


def __getattr__(name: str) -> keel.App:
    # `keel worker tests.support.apps.poison:app`: built on first use, so that importing the
    # module (the test does, for `register`) opens no database.
    if name == "app":
        globals()["app"] = built = register(keel.App(max_attempts=MAX_ATTEMPTS))
        return built
    raise AttributeError(name)
