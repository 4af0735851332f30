"""Resume, not rerun: a failed run put back in the queue continues from its last checkpoint under
the same run id, with its ledger, so the customer it already charged is not charged again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.effects.ledger import Effect
from keel.core.errors import InvalidTransition, RunNotFound
from tests.support.graphs import charge_effect
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


class Order(TypedDict, total=False):
    amount: int
    receipt: Any
    shipped: bool


def charge_then_ship(charge: Effect[..., Any], broken: list[bool]) -> StateGraph:
    async def pay(state: Order) -> dict[str, Any]:
        return {"receipt": await charge(state["amount"])}  # type: ignore[misc]

    def ship(state: Order) -> dict[str, Any]:
        if broken[0]:
            raise RuntimeError("warehouse API rejected the label")  # the user's own failure
        return {"shipped": True}

    g = StateGraph(Order)
    g.add_node("pay", pay)
    g.add_node("ship", ship)
    g.add_edge(START, "pay")
    g.add_edge("pay", "ship")
    g.add_edge("ship", END)
    return g


def test_a_resumed_run_continues_from_its_checkpoint_and_does_not_charge_again(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    broken = [True]
    app = make_app()
    app.workflow("order")(lambda: charge_then_ship(charge_effect(provider), broken))
    run_id = app.submit("order", job_id="order-1", input={"amount": 42}).run_id
    drain(app)
    failed = app.get_run(run_id)
    assert (failed.status, failed.termination_reason) == ("failed", "execution_error")
    assert len(provider.deliveries) == 1

    broken[0] = False  # the operator fixed the warehouse, then resumes
    row = app.resume(run_id, by="ops")
    assert (row["status"], row["termination_reason"], row["error"]) == ("queued", None, None)
    drain(app)
    done = app.get_run(run_id)
    assert done.status == "completed" and done.output["shipped"] is True
    assert len(provider.deliveries) == 1 and len(provider.calls) == 1  # pay did not run again
    assert done.output["receipt"] == provider.results[provider.deliveries[0]]
    resumed = [e for e in done.timeline if e["kind"] == "status.queued"]
    assert resumed[-1]["data"]["reason"] == "resumed" and resumed[-1]["data"]["by"] == "ops"
    assert resumed[-1]["data"]["previous"]["termination_reason"] == "execution_error"
    assert app.list_runs(job_id="order-1") == [app.list_runs(job_id="order-1")[0]]  # one run


def test_a_failed_effect_is_reconciled_on_resume_not_failed_again_nor_sent_twice(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    down = [True]
    charge = charge_effect(provider, reconcile=True)
    real_fn = charge.fn

    async def flaky(amount: int, *, idempotency_key: str) -> Any:
        if down[0]:
            raise PermissionError("card processor refused the merchant account")
        return await real_fn(amount, idempotency_key=idempotency_key)

    charge.fn = flaky
    app = make_app()
    app.workflow("order")(lambda: charge_then_ship(charge, [False]))
    run_id = app.submit("order", job_id="order-2", input={"amount": 7}).run_id
    drain(app)
    assert app.get_run(run_id).status == "failed"
    assert provider.deliveries == []

    down[0] = False
    app.resume(run_id)
    drain(app)
    done = app.get_run(run_id)
    assert done.status == "completed"
    assert len(provider.deliveries) == 1
    assert [e["status"] for e in done.effects] == ["sent"]


def test_only_a_failed_run_can_be_resumed(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("order")(lambda: charge_then_ship(charge_effect(provider), [False]))
    queued = app.submit("order", job_id="q", input={"amount": 1}).run_id
    with pytest.raises(InvalidTransition, match="is queued: only a failed run can be resumed"):
        app.resume(queued)
    app.cancel(queued)
    with pytest.raises(InvalidTransition, match="cancelled run stays cancelled"):
        app.resume(queued)
    with pytest.raises(RunNotFound):
        app.resume("no-such-run-0000000000000000")
    assert app.get_run(queued).status == "cancelled"
