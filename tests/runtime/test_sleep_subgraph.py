"""`keel.sleep` inside a subgraph, on both backends: the run waits on one timer, wakes when the
database's clock passes it, and the subgraph's node goes on past its sleep once."""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from tests.support.workers import drain, sweep


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def nested(calls: list[str]) -> StateGraph:
    """A parent whose `inner` node is a compiled subgraph whose node sleeps 60 s."""

    def rest(state: S) -> dict[str, Any]:
        calls.append("rest")
        keel.sleep(60)
        calls.append("woke")
        return {"log": ["rested"]}

    sub = StateGraph(S)
    sub.add_node("rest", rest)
    sub.add_edge(START, "rest")
    sub.add_edge("rest", END)

    def after(state: S) -> dict[str, Any]:
        calls.append("after")
        return {"log": ["after"]}

    g = StateGraph(S)
    g.add_node("inner", sub.compile())
    g.add_node("after", after)
    g.add_edge(START, "inner")
    g.add_edge("inner", "after")
    g.add_edge("after", END)
    return g


def test_a_sleep_inside_a_subgraph_wakes_once(make_app: Callable[..., keel.App]) -> None:
    clock = keel.ManualClock()
    calls: list[str] = []
    app = make_app(clock=clock)
    app.workflow("nested")(lambda: nested(calls))
    run_id = app.submit("nested", {}, job_id="j-nested").run_id
    drain(app)
    (timer,) = app.get_run(run_id).waits
    assert (timer["kind"], timer["status"]) == ("timer", "pending")
    assert timer["deadline"] - clock.now() == pytest.approx(60)
    clock.advance(30)
    assert sweep(app) == 0, "not before its time"
    clock.advance(31)
    assert sweep(app) == 1
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed"
    assert json.loads(details.run["output"])["log"] == ["rested", "after"]
    assert [(w["wait_id"], w["decision"]) for w in details.waits] == [(timer["wait_id"], "woke")]
    assert calls == ["rest", "rest", "woke", "after"]
