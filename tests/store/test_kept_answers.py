"""An answer heard, its record lost: the database fails the statement that records a provider's
answer, the execution is given back, and the run's next execution in this process records that
answer instead of waiting out the call's deadline (keel.core.answers). An outbox dispatcher
records its delivery again through the outage (keel.core.infra.outlast).

The failure is the database's own: SQLite's connector fails the record's statement as a
dropped connection would (the fault harness's `fail-next-statement`), so SQLite only. What is
counted is what the provider received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from tests.support import outbox_flows
from tests.support.graphs import charge_effect, pay_graph
from tests.support.lost_records import records_fail
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]
pytestmark = pytest.mark.parametrize("backend", ["sqlite"])
DEADLINE = 30.0
"""The effects' timeout: a run that waited it out would outlast the test's drain."""


@pytest.mark.parametrize("failures", [1, 2])
def test_an_answer_whose_record_failed_is_recorded_by_the_next_execution(
    make_app: AppFactory, failures: int
) -> None:
    provider = Provider()
    app = make_app(effect_timeout=DEADLINE)
    # No reconciler: without the kept answer, past the deadline only a person could say.
    app.workflow("pay")(lambda: pay_graph(charge_effect(provider)))
    run_id = app.submit("pay", job_id="p-1", input={"amount": 5}).run_id
    left = records_fail(app, "record_effect", "sent", failures)
    drain(app, within=DEADLINE / 2)
    details = app.get_run(run_id)
    kinds = [e["kind"] for e in details.timeline]
    assert left["times"] == 0 and kinds.count("attempt.interrupted") == failures, kinds
    assert details.status == "completed", kinds
    assert "effect.awaiting_deadline" not in kinds
    assert len(provider.calls) == 1 and len(provider.deliveries) == 1
    [effect] = details.effects
    assert effect["status"] == "sent"
    assert details.output["receipt"] == provider.results[provider.calls[0]]
    assert len(app.aio.runtime.services.answers) == 0


class Order(TypedDict, total=False):
    order_id: str
    receipt: Any


def test_a_key_the_threads_runs_share_is_not_answered_from_memory(make_app: AppFactory) -> None:
    """With `key=` on a thread, the key is the thread's and its runs' lease tokens each count
    from 1: a kept answer could be another run's. It waits out the deadline and reconciles."""
    provider = Provider()
    app = make_app(effect_timeout=0.5)

    @keel.effect(
        "charge",
        key="order_id",
        reconcile=lambda order_id, *, idempotency_key: provider.lookup(idempotency_key),
    )
    def charge(order_id: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        return provider.deliver(idempotency_key, order_id)

    def shop() -> StateGraph:
        g = StateGraph(Order)
        g.add_node("pay", lambda s: {"receipt": charge(s["order_id"])})
        g.add_edge(START, "pay")
        g.add_edge("pay", END)
        return g

    app.workflow("shop")(shop)
    run_id = app.submit("shop", {"order_id": "o-1"}, thread_id="t-1").run_id
    left = records_fail(app, "record_effect", "sent", 1)
    drain(app, within=20)
    details = app.get_run(run_id)
    kinds = [e["kind"] for e in details.timeline]
    assert left["times"] == 0 and "attempt.interrupted" in kinds, kinds
    assert details.status == "completed", kinds
    assert "effect.awaiting_deadline" in kinds
    assert [e["status"] for e in details.effects] == ["confirmed"]
    assert len(provider.deliveries) == 1
    assert len(app.aio.runtime.services.answers) == 0


@keel.effect("kept_mail", outbox=True)
def plain_mail(to: str, *, idempotency_key: str = keel.KEY) -> Any:
    """Neither idempotent nor reconcilable: once in doubt, only a person could say."""
    return outbox_flows._post({"to": to}, idempotency_key)


@pytest.mark.parametrize("failures", [1, 5])
def test_an_outbox_delivery_whose_record_failed_is_recorded_not_left_in_doubt(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    """Five failures take the record's retries past the intent's claim and its call's deadline:
    the dispatcher, looking for work meanwhile, must not reclaim it as a dead one's."""
    app = make_app(lease_ttl=1, effect_timeout=0.2)
    enqueue = ("enqueue", lambda s: {"handle": plain_mail(s["to"])})
    app.workflow("kept")(outbox_flows.graph(enqueue, ("wait", outbox_flows.wait)))
    left = records_fail(app, "settle_intent", "delivered", failures)
    with outbox_flows.serving(monkeypatch) as provider:
        run_id = app.submit("kept", job_id="k-1", input={"to": "ann@example.com"}).run_id
        outbox_flows.drain(app)
    details = app.get_run(run_id)
    kinds = [e["kind"] for e in details.timeline]
    # Fewer: another statement took an armed failure (a dispatcher reclaiming the intent).
    assert left["times"] == 0, "the delivery's record failed fewer times than armed"
    assert [i["status"] for i in app.effect_intents(run_id=run_id)] == ["delivered"], kinds
    assert details.status == "completed", kinds
    assert len(provider.deliveries) == 1
    assert details.output["result"] == {"ok": True, "delivery": 1}, "the answer heard"
