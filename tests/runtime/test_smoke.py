"""The whole path once per backend: admit, run to an approval, decide, finish, effect once."""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

import keel

CALLS: list[str] = []


@keel.effect("notify")
def notify(to: str, *, idempotency_key: str) -> dict[str, str]:
    CALLS.append(idempotency_key)
    return {"to": to}


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def review(state: State) -> dict[str, list[str]]:
    decision = keel.approval("manager", payload={"q": 1})
    return {"log": [decision.decision]}


def send(state: State) -> dict[str, list[str]]:
    notify("ops@example.com")
    return {"log": ["sent"]}


def build() -> StateGraph:
    g = StateGraph(State)
    g.add_node("review", review)
    g.add_node("send", send)
    g.add_edge(START, "review")
    g.add_edge("review", "send")
    g.add_edge("send", END)
    return g


def test_run_waits_then_completes_with_one_effect(make_app) -> None:
    CALLS.clear()
    app = make_app(lease_ttl=5)
    app.workflow("smoke")(build)
    run = app.submit("smoke", job_id="smoke-1", input={"log": []})
    assert app.submit("smoke", job_id="smoke-1", input={"log": []})["run_id"] == run["run_id"]
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert app.get_run(run["run_id"]).status == "waiting"
    first = app.approve(run["run_id"], by="alice")
    again = app.approve(run["run_id"], by="bob")
    assert (first.recorded, again.recorded) == (True, False)
    assert again.wait["decided_by"] == "alice"
    app.run_worker(stop_when_idle=True, handle_signals=False)
    details = app.get_run(run["run_id"])
    assert (details.status, details.decision, details.termination_reason) == (
        "completed",
        "approved",
        "approved",
    )
    assert details.output["log"] == ["approved", "sent"]
    assert len(CALLS) == 1
    assert [e["status"] for e in details.effects] == ["sent"]
