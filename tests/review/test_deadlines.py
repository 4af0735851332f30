"""Deadlines: a wait's policy does not depend on how often the sweeper happened to run.

A sweep reads the due stages and the expired waits once, then applies each in its own
transaction. A wait that is both (its escalation stage and its deadline fall due together, or
the sweeper was down) must be judged on its state after the stage was applied, not on the
snapshot read before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from tests.review.parts import drain

AppFactory = Callable[..., keel.App]


class AskState(TypedDict, total=False):
    decision: str


def build() -> StateGraph:
    def ask(state: AskState) -> dict[str, Any]:
        answer = keel.approval(
            "manager",
            timeout="1h",
            on_timeout="escalate",
            escalate_after="1h",
            escalate_to=["director"],
        )
        return {"decision": answer.decision}

    g = StateGraph(AskState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def sweep(app: keel.App) -> int:
    async def go() -> int:
        await app.aio.open()
        return await app.aio.sweep()

    return app.aio.portal.call(go())


@pytest.mark.parametrize("passes", ["one pass", "two passes"])
def test_escalation_policy_extends_the_deadline_however_the_sweeps_fall(
    make_app: AppFactory, passes: str
) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("ask")(build)
    run = app.submit("ask", job_id="ask-1", input={})["run_id"]
    drain(app)
    if passes == "two passes":
        clock.advance(3600)  # the escalation stage falls due first...
        sweep(app)
        clock.advance(1)  # ...and the deadline a second later
    else:
        clock.advance(3601)  # both are due when the sweeper next looks
    sweep(app)
    details = app.get_run(run)
    [wait] = details.waits
    # The stage escalated to the director; the policy then extends the deadline once
    # instead of rejecting: a person still has time to answer.
    assert (wait["status"], details.status) == ("pending", "waiting"), wait
    assert wait["deadline"] > clock.now()
    kinds = [e["kind"] for e in details.timeline]
    assert kinds.count("wait.escalated") == 2 and "wait.expired" not in kinds
