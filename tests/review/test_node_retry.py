"""LangGraph's RetryPolicy re-runs a failed node in the same step: its effects must not repeat."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

import keel
from tests.review.parts import Provider, drain

AppFactory = Callable[..., keel.App]


class MailState(TypedDict, total=False):
    to: str
    receipt: Any
    attempts: int


def test_node_retried_by_langgraph_performs_its_effect_once(make_app: AppFactory) -> None:
    provider = Provider()
    attempts: list[str] = []

    @keel.effect("send")
    def send(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    def deliver(state: MailState) -> dict[str, Any]:
        receipt = send(state["to"])
        attempts.append(receipt["id"])
        if len(attempts) == 1:
            raise ConnectionError("the CRM update after the email failed")  # retried
        return {"receipt": receipt}

    def build() -> StateGraph:
        g = StateGraph(MailState)
        g.add_node(
            "deliver",
            deliver,
            retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False),
        )
        g.add_edge(START, "deliver")
        g.add_edge("deliver", END)
        return g

    app = make_app()
    app.workflow("mail")(build)
    run = app.submit("mail", job_id="retry-1", input={"to": "a@x"})["run_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(attempts) == 2  # the node ran twice...
    assert len(provider.deliveries) == 1  # ...the email went out once
    assert attempts[0] == attempts[1] == details.output["receipt"]["id"]
