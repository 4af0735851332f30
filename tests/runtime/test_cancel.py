"""Cancellation: a run cancelled while it runs performs no effect after the request.

Keel stops a cancelled run at its next step boundary, which is a checkpoint write. A workflow
may ask for `durability="exit"` (or "async"): then no checkpoint is awaited between steps, the
run executes to its end, performs every effect, and is reported `cancelled` afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.context import current
from tests.support.providers import Provider
from tests.support.workers import claim, execute

AppFactory = Callable[..., keel.App]


class MailState(TypedDict, total=False):
    to: str
    receipt: Any


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_cancel_requested_mid_run_performs_no_later_effect(
    make_app: AppFactory, durability: str
) -> None:
    provider = Provider()
    app = make_app()
    cancelled: dict[str, Any] = {}

    async def prepare(state: MailState) -> dict[str, Any]:
        # The operator cancels while this step runs (a real cancel, from another thread).
        run_id = current().run_id
        cancelled["row"] = await asyncio.to_thread(app.cancel, run_id, by="ops")
        return {"to": state["to"].lower()}

    @keel.effect("send")
    async def send(to: str, *, idempotency_key: str) -> Any:
        return provider.deliver(idempotency_key, to)

    async def deliver(state: MailState) -> dict[str, Any]:
        return {"receipt": await send(state["to"])}

    def build() -> StateGraph:
        g = StateGraph(MailState)
        g.add_node("prepare", prepare)
        g.add_node("deliver", deliver)
        g.add_edge(START, "prepare")
        g.add_edge("prepare", "deliver")
        g.add_edge("deliver", END)
        return g

    app.workflow("mail", durability=durability)(build)
    run = app.submit("mail", job_id="mail-c", input={"to": "A@X"})["run_id"]
    outcome = execute(app, *claim(app, "worker-a"))
    assert cancelled["row"]["cancel_requested"]
    assert (outcome, app.get_run(run).status) == ("cancelled", "cancelled")
    assert provider.deliveries == [], "a run cancelled before its email step sent the email"


class AskState(TypedDict, total=False):
    decision: str


def test_cancel_requested_before_the_run_pauses_does_not_leave_it_waiting(
    make_app: AppFactory,
) -> None:
    """The operator cancels while the step that asks for an approval runs: the run must end
    cancelled, not start waiting for a person (and notify approvers) as if nothing happened."""
    app = make_app()

    async def ask(state: AskState) -> dict[str, Any]:
        await asyncio.to_thread(app.cancel, current().run_id, by="ops")
        return {"decision": keel.approval("manager", timeout="1h").decision}

    def build() -> StateGraph:
        g = StateGraph(AskState)
        g.add_node("ask", ask)
        g.add_edge(START, "ask")
        g.add_edge("ask", END)
        return g

    app.workflow("ask")(build)
    run = app.submit("ask", job_id="ask-c", input={})["run_id"]
    outcome = execute(app, *claim(app, "worker-a"))
    details = app.get_run(run)
    assert (outcome, details.status) == ("cancelled", "cancelled")
    assert [w["status"] for w in details.waits] in ([], ["expired"])
