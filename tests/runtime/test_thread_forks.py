"""Forks: a run from a past checkpoint of its thread is a new run, with effect keys of its own.

An effect's key is its place in its run (docs/effects.md), so a fork that executes an effect's
node again performs the effect again, under a new key, unless `key=` ties the effect to its
business identity: on a thread, the key is then the thread and those arguments, and the fork
gets the first call's recorded result. The provider counts what the outside world saw
(docs/threads.md).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from keel.core.effects.ledger import Effect
from tests.support.providers import Provider
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


class Order(TypedDict, total=False):
    order_id: str
    amount: int
    log: Annotated[list[str], operator.add]


def order_graph(charge: Effect[..., Any]) -> Callable[[], StateGraph]:
    """prepare -> pay (the effect) -> receipt."""

    def prepare(state: Order) -> dict[str, Any]:
        return {"log": ["prepared"]}

    def pay(state: Order) -> dict[str, Any]:
        charge(state["order_id"], state["amount"])
        return {"log": ["paid"]}

    def receipt(state: Order) -> dict[str, Any]:
        return {"log": ["receipt"]}

    def build() -> StateGraph:
        g = StateGraph(Order)
        g.add_node("prepare", prepare)
        g.add_node("pay", pay)
        g.add_node("receipt", receipt)
        g.add_edge(START, "prepare")
        g.add_edge("prepare", "pay")
        g.add_edge("pay", "receipt")
        g.add_edge("receipt", END)
        return g

    return build


def charge_effect(
    provider: Provider, *, business_key: bool = False, **options: Any
) -> Effect[..., Any]:
    """The notify_effect pattern (tests/support/graphs.py) for a charge: the provider gets
    Keel's key, or with `business_key` one made from the order id."""

    def charge(order_id: str, amount: int, *, idempotency_key: str = keel.KEY) -> Any:
        provider.calls.append(idempotency_key)
        key = f"charge-{order_id}" if business_key else idempotency_key
        return provider.deliver(key, {"order": order_id, "amount": amount})

    return keel.effect("charge", **options)(charge)


def ordered(app: keel.App, thread_id: str) -> str:
    """Run one order on `thread_id` to its end; its run id."""
    run_id = app.submit("shop", {"order_id": "o-17", "amount": 40}, thread_id=thread_id).run_id
    drain(app)
    assert app.get_run(run_id).status == "completed"
    return run_id


def checkpoint_before(app: keel.App, thread_id: str, node: str) -> str:
    """The id of the thread's checkpoint whose next task is `node`."""
    [found] = [h for h in app.get_history(thread_id) if h.next == (node,)]
    return str(found.config["configurable"]["checkpoint_id"])


def fork(app: keel.App, thread_id: str, checkpoint_id: str) -> str:
    run_id = app.submit("shop", thread_id=thread_id, checkpoint_id=checkpoint_id).run_id
    drain(app)
    assert app.get_run(run_id).status == "completed"
    return run_id


def test_a_fork_before_the_effects_node_performs_it_again_under_a_new_key(
    make_app: AppFactory,
) -> None:
    provider = Provider(dedupe=True)  # it honours keys: only a new key is a second delivery
    app = make_app()
    app.workflow("shop")(order_graph(charge_effect(provider)))
    first = ordered(app, "t-order")
    second = fork(app, "t-order", checkpoint_before(app, "t-order", "pay"))

    assert len(provider.deliveries) == len(set(provider.deliveries)) == 2
    [first_effect] = app.get_run(first).effects
    [fork_effect] = app.get_run(second).effects
    assert first_effect["idempotency_key"] == provider.deliveries[0]
    assert fork_effect["idempotency_key"] == provider.deliveries[1]
    # The thread's head is the fork's branch, which paid once; the first branch stays in history.
    assert app.get_state("t-order").values["log"] == ["prepared", "paid", "receipt"]
    assert app.get_state("t-order").metadata["keel_run_id"] == second
    assert sum(h.metadata.get("keel_run_id") == first for h in app.get_history("t-order")) > 1


def test_key_ties_a_forks_effect_to_its_business_identity(make_app: AppFactory) -> None:
    provider = Provider()  # no dedupe of its own: every call Keel makes is a delivery
    app = make_app()
    app.workflow("shop")(order_graph(charge_effect(provider, key="order_id")))
    first = ordered(app, "t-order")
    fork(app, "t-order", checkpoint_before(app, "t-order", "pay"))
    assert len(provider.deliveries) == 1  # the fork got the recorded result
    [effect] = app.get_run(first).effects
    assert effect["status"] == "sent"

    # Another order on the same thread is another identity; another thread is another scope.
    app.submit("shop", {"order_id": "o-18", "amount": 5}, thread_id="t-order")
    drain(app)
    ordered(app, "t-other")
    assert len(provider.deliveries) == 3


def test_a_business_key_at_the_provider_makes_a_fork_charge_once(make_app: AppFactory) -> None:
    provider = Provider(dedupe=True)
    app = make_app()
    charge = charge_effect(provider, business_key=True)
    app.workflow("shop")(order_graph(charge))
    first = ordered(app, "t-order")
    second = fork(app, "t-order", checkpoint_before(app, "t-order", "pay"))

    assert provider.deliveries == ["charge-o-17"]  # what the outside world saw: one charge
    assert len(set(provider.calls)) == 2  # two runs, two Keel keys, one business identity
    [first_effect] = app.get_run(first).effects
    [fork_effect] = app.get_run(second).effects
    assert first_effect["idempotency_key"] != fork_effect["idempotency_key"]
    assert first_effect["status"] == fork_effect["status"] == "sent"
    assert first_effect["result"] == fork_effect["result"]  # the provider's first answer


def test_a_fork_after_the_effects_node_does_not_perform_it(make_app: AppFactory) -> None:
    provider = Provider()
    app = make_app()
    app.workflow("shop")(order_graph(charge_effect(provider)))
    ordered(app, "t-order")
    second = fork(app, "t-order", checkpoint_before(app, "t-order", "receipt"))

    assert len(provider.deliveries) == 1  # the branch's state already holds the payment
    assert app.get_run(second).effects == []
    assert app.get_state("t-order").values["log"] == ["prepared", "paid", "receipt"]
