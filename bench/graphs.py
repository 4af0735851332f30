"""The graphs every case runs, identical for Keel and for raw LangGraph.

Nodes are plain `def` functions that do almost nothing, so what is measured is the cost of
durability (checkpoints, fencing, ledger, timeline), not the work of the nodes.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import os
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

import keel

NODES = ("a", "b", "c", "d", "e")
FAN_WIDTH = 4
FAN_WIDTHS = (1, 10, 100)  # case fanout's curve


class State(TypedDict, total=False):
    n: int
    blob: str
    decision: str
    hits: Annotated[list[int], operator.add]


def _bump(state: State) -> dict[str, Any]:
    return {"n": state.get("n", 0) + 1}


def _rewrite_blob(state: State) -> dict[str, Any]:
    # Every step changes the large value, so every checkpoint has to carry it again.
    blob = state.get("blob", "")
    n = state.get("n", 0) + 1
    return {"n": n, "blob": chr(97 + n % 26) + blob[1:] if blob else blob}


def _sleepy(state: State) -> dict[str, Any]:
    time.sleep(float(os.environ.get("BENCH_STEP_SLEEP", "0.3")))
    return _bump(state)


async def _nap(state: State) -> dict[str, Any]:
    # Awaits, so a worker can hold many such runs in flight on one event loop.
    await asyncio.sleep(float(os.environ.get("BENCH_NAP", "5")))
    return _bump(state)


def _touch_plain(i: int) -> dict[str, int]:
    return {"i": i}


@keel.effect("bench_touch")
def touch(i: int, *, idempotency_key: str) -> dict[str, int]:
    return {"i": i}


def _with_effect(state: State) -> dict[str, Any]:
    touch(state.get("n", 0))
    return _bump(state)


def _without_effect(state: State) -> dict[str, Any]:
    _touch_plain(state.get("n", 0))
    return _bump(state)


def chain(node: Any = _bump, length: int = len(NODES)) -> StateGraph:
    """A straight line of `length` nodes, each running `node`."""
    g = StateGraph(State)
    names = [f"{NODES[i % len(NODES)]}{i // len(NODES) or ''}" for i in range(length)]
    for name in names:
        g.add_node(name, node)
    g.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        g.add_edge(a, b)
    g.add_edge(names[-1], END)
    return g


def chain5() -> StateGraph:
    return chain(_bump)


def chain5_blob() -> StateGraph:
    return chain(_rewrite_blob)


def chain5_effect() -> StateGraph:
    return chain(_with_effect)


def chain5_no_effect() -> StateGraph:
    return chain(_without_effect)


def chain5_slow() -> StateGraph:
    return chain(_sleepy)


def nap() -> StateGraph:
    """One node that awaits BENCH_NAP seconds: a run that stays in flight, idle."""
    return chain(_nap, 1)


def chain20() -> StateGraph:
    return chain(_bump, 20)


def _spread(state: State) -> list[Send]:
    return [Send("leaf", {"n": i}) for i in range(FAN_WIDTH)]


def _leaf(state: State) -> dict[str, Any]:
    return {"hits": [state.get("n", 0)]}


def _join(state: State) -> dict[str, Any]:
    return {"n": state.get("n", 0) + len(state.get("hits", []))}


def fanout4() -> StateGraph:
    """fan -> 4 parallel `leaf` tasks through `Send` -> join: 3 supersteps, 6 tasks."""
    return _fanout(_spread)


def _fanout(spread: Any) -> StateGraph:
    g = StateGraph(State)
    g.add_node("fan", _bump)
    g.add_node("leaf", _leaf)
    g.add_node("join", _join)
    g.add_edge(START, "fan")
    g.add_conditional_edges("fan", spread, ["leaf"])
    g.add_edge("leaf", "join")
    g.add_edge("join", END)
    return g


def _fanout_of(width: int) -> Any:
    def spread(state: State) -> list[Send]:
        return [Send("leaf", {"n": i}) for i in range(width)]

    def factory() -> StateGraph:
        return _fanout(spread)

    factory.__doc__ = f"fan -> {width} `Send` leaves -> join: 3 supersteps, {width + 2} tasks."
    return factory


# One factory object per width: RawRunner compiles once per factory it is given.
FANOUTS: dict[int, Any] = {w: _fanout_of(w) for w in FAN_WIDTHS}


def _prepare(state: State) -> dict[str, Any]:
    return _bump(state)


def _keel_review(state: State) -> dict[str, Any]:
    decision = keel.approval("bench", payload={"n": state.get("n", 0)}, timeout="1h")
    return {"decision": decision.decision}


def _raw_review(state: State) -> dict[str, Any]:
    answer = interrupt({"n": state.get("n", 0)})
    return {"decision": str(answer.get("decision", "")) if isinstance(answer, dict) else ""}


def _approval(review: Any) -> StateGraph:
    g = StateGraph(State)
    g.add_node("prepare", _prepare)
    g.add_node("review", review)
    g.add_node("finish", _bump)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "review")
    g.add_edge("review", "finish")
    g.add_edge("finish", END)
    return g


def approval_keel() -> StateGraph:
    return _approval(_keel_review)


def approval_raw() -> StateGraph:
    return _approval(_raw_review)


WORKFLOWS = {
    "chain5": chain5,
    "chain5-blob": chain5_blob,
    "chain5-effect": chain5_effect,
    "chain5-no-effect": chain5_no_effect,
    "chain5-slow": chain5_slow,
    "chain20": chain20,
    "nap": nap,
    "fanout4": fanout4,
    "approval": approval_keel,
    **{f"fanout-{w}": f for w, f in FANOUTS.items()},
}


def register(app: keel.App) -> keel.App:
    """Register every bench workflow on `app`."""
    for name, factory in WORKFLOWS.items():
        app.workflow(name)(factory)
    return app
