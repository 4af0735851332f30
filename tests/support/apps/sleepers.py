"""A workflow that sleeps durably, for the sleep tests' real `keel worker` processes.

`nap` sleeps `input["seconds"]` with `keel.asleep()`, then records the database's time it woke
at (`woke_at`): a test compares it with the timer wait's wake time (its deadline), both on the
database's clock. Env: KEEL_DATABASE_URL.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.core.context import current

app = keel.App()


class Nap(TypedDict, total=False):
    seconds: float
    woke_at: float


async def nap(state: Nap) -> dict[str, Any]:
    await keel.asleep(state["seconds"])
    return {"woke_at": await current().services.store.database_now()}


@app.workflow("sleeper")
def sleeper() -> StateGraph:
    g = StateGraph(Nap)
    g.add_node("nap", nap)
    g.add_edge(START, "nap")
    g.add_edge("nap", END)
    return g
