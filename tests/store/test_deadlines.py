"""Nothing waits forever: each expired wait's policy is applied exactly once, however many
sweepers race and however the sweeps fall, with time moved by an injectable clock (no sleeping
for deadlines).

A sweep reads the due stages and the expired waits once, then applies each in its own
transaction. A wait that is both (its escalation stage and its deadline fall due together, or
the sweeper was down) must be judged on its state after the stage was applied, not on the
snapshot read before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from tests.support.workers import drain, sweep

AppFactory = Callable[..., keel.App]
POLICIES = ["reject", "timeout", "cancel", "fail", "escalate"]


class State(TypedDict, total=False):
    policy: str
    decision: str


def ask(state: State) -> State:
    answer = keel.approval("manager", timeout="1h", on_timeout=state["policy"])
    return {"decision": answer.decision}


def build() -> StateGraph:
    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def _sweep_from(apps: list[keel.App]) -> int:
    applied: list[int] = []

    def sweep(app: keel.App) -> None:
        async def go() -> int:
            await app.aio.open()
            return await app.aio.runtime.sweep()

        applied.append(app.aio.runtime.portal.call(go()))

    threads = [threading.Thread(target=sweep, args=(a,)) for a in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(applied)


def test_each_deadline_policy_applies_once_under_racing_sweepers(
    make_app: Callable[..., keel.App],
) -> None:
    clock = keel.ManualClock()
    apps = [make_app(clock=clock) for _ in range(4)]
    for app in apps:
        app.workflow("deadline")(build)
    main = apps[0]
    runs = {
        p: main.submit("deadline", job_id=f"d-{p}", input={"policy": p})["run_id"] for p in POLICIES
    }
    main.run_worker(stop_when_idle=True, handle_signals=False)
    assert {main.get_run(r).status for r in runs.values()} == {"waiting"}

    assert _sweep_from(apps) == 0, "nothing is due before the deadline"
    clock.advance(3601)
    assert _sweep_from(apps) == len(POLICIES), "one application per wait, whoever raced"
    escalated = main.get_run(runs["escalate"])
    assert escalated.waits[0]["status"] == "pending"
    assert escalated.waits[0]["escalation_level"] == 1
    clock.advance(3601)
    assert _sweep_from(apps) == 1, "the escalated wait reaches its final policy once"
    assert _sweep_from(apps) == 0
    main.run_worker(stop_when_idle=True, handle_signals=False)

    outcome = {p: main.get_run(r) for p, r in runs.items()}
    for policy, details in outcome.items():
        expired = [e for e in details.timeline if e["kind"] == "wait.expired"]
        assert len(expired) == 1, (policy, expired)
    summary = {
        p: (d.status, d.decision, d.termination_reason, (d.output or {}).get("decision"))
        for p, d in outcome.items()
    }
    # A rejection the deadline applied is the decision the graph saw, but time ran out.
    assert summary == {
        "reject": ("completed", "rejected", "timed_out", "rejected"),
        "timeout": ("completed", "not_decided", "timed_out", "timed_out"),
        "cancel": ("cancelled", "not_decided", "cancelled", None),
        "fail": ("failed", "not_decided", "timed_out", None),
        "escalate": ("completed", "rejected", "timed_out", "rejected"),
    }
    assert sum(e["kind"] == "wait.escalated" for e in outcome["escalate"].timeline) == 1


def test_a_decision_after_the_final_policy_is_refused(make_app) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("deadline")(build)
    run_id = app.submit("deadline", job_id="late", input={"policy": "timeout"})["run_id"]
    app.run_worker(stop_when_idle=True, handle_signals=False)
    wait_id = app.get_run(run_id).waits[0]["wait_id"]
    clock.advance(7200)
    assert _sweep_from([app]) == 1
    before = len(app.get_run(run_id).timeline)
    with pytest.raises(keel.RunFinished):
        app.approve(run_id, wait_id=wait_id, by="too-late")
    assert len(app.get_run(run_id).timeline) == before


# -- an escalation stage and the deadline falling due together ------------------------------


class AskState(TypedDict, total=False):
    decision: str


def staged_escalation(**stages: str) -> StateGraph:
    """An approval that escalates to the director at `stages` (default: at its deadline), and
    whose deadline policy is to escalate."""
    stages = stages or {"escalate_after": "1h"}

    def ask(state: AskState) -> dict[str, Any]:
        answer = keel.approval(
            "manager", timeout="1h", on_timeout="escalate", escalate_to=["director"], **stages
        )
        return {"decision": answer.decision}

    g = StateGraph(AskState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


@pytest.mark.parametrize("passes", ["one pass", "two passes"])
@pytest.mark.parametrize(
    "stages",
    [{}, {"remind_after": "30m", "escalate_after": "50m"}],
    ids=["escalate at the deadline", "remind, then escalate"],
)
def test_escalation_policy_extends_the_deadline_however_the_sweeps_fall(
    make_app: AppFactory, passes: str, stages: dict[str, str]
) -> None:
    """Both stages owed when the deadline passed (no sweep ran, as after an outage): the
    policy rejected at once, the director never told."""
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("ask")(lambda: staged_escalation(**stages))
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
    assert kinds.count("wait.reminded") == (1 if "remind_after" in stages else 0)
