"""In-doubt effects: a person's answer is used once, never replayed into a second send.

The crash is made in-process and honestly: the effect's call stalls its worker past the lease
(a ManualClock moves) while another worker takes the run over with a real claim, so the stale
worker's `record` is fenced out and the ledger row keeps its earlier status — exactly what a
SIGKILL between the provider call and the record leaves behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

import keel
from tests.integration.graphs import pay_graph
from tests.integration.graphs import steal_lease as take_over
from tests.review.parts import Provider, claim, drain, execute

AppFactory = Callable[..., keel.App]


def test_crash_after_performing_a_not_performed_resolution_does_not_send_twice(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=30)
    # Which calls stall their worker past the lease, and whether they reach the provider first.
    script = [("stall", False), ("stall", True)]

    async def charge(amount: int, *, idempotency_key: str) -> Any:
        if script:
            _, deliver = script.pop(0)
            result = provider.deliver(idempotency_key, amount) if deliver else None
            await take_over(app, clock)  # this worker is now stale: its record is fenced out
            if result is None:
                raise ConnectionResetError("reset before the provider answered")
            return result
        return provider.deliver(idempotency_key, amount)

    app.workflow("pay")(lambda: pay_graph(keel.effect("charge")(charge)))
    run = app.submit("pay", job_id="order-9", input={"amount": 5})["run_id"]

    # 1. The first call never reached the provider; the worker lost the run mid-call.
    assert execute(app, *claim(app, "worker-a")) == "lease_lost"
    clock.advance(app.aio.lease_ttl + 1)
    drain(app)
    details = app.get_run(run)
    assert details.status == "waiting" and [e["status"] for e in details.effects] == ["in_doubt"]
    assert provider.deliveries == []

    # 2. A person checks the provider and rightly says: not performed.
    app.resolve_effect(run, performed=False, by="support")

    # 3. The resumed worker performs it (delivery 1) and dies before recording it.
    clock.advance(app.aio.lease_ttl + 1)
    assert execute(app, *claim(app, "worker-b")) == "lease_lost"
    assert len(provider.deliveries) == 1

    # 4. The next worker must not act on the same old answer again.
    clock.advance(app.aio.lease_ttl + 1)
    drain(app)
    assert len(provider.deliveries) == 1, "the effect reached the provider twice"
    # It is in doubt again, and a person is asked again (a new wait, the old one stays decided).
    details = app.get_run(run)
    assert details.status == "waiting"
    assert [e["status"] for e in details.effects] == ["in_doubt"]
    assert sorted(w["status"] for w in details.waits) == ["decided", "pending"]

    # 5. This time the person finds it at the provider: the run completes, nothing resent.
    app.resolve_effect(run, performed=True, result={"id": "p-1"}, by="support")
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert details.output["receipt"] == {"id": "p-1"}
    assert [e["status"] for e in details.effects] == ["confirmed"]
    assert len(provider.deliveries) == 1


class PairState(TypedDict, total=False):
    amount: int
    receipt: Any
    decision: str


def test_in_doubt_deadline_passing_while_queued_is_not_taken_as_not_performed(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=30)
    stalls = [True]

    async def charge(amount: int, *, idempotency_key: str) -> Any:
        result = provider.deliver(idempotency_key, amount)
        if stalls:
            stalls.pop()
            await take_over(app, clock)  # delivered, but the record is fenced out: in doubt
        return result

    send = keel.effect("charge")(charge)

    async def pay(state: PairState) -> dict[str, Any]:
        return {"receipt": await send(state["amount"])}

    def ask(state: PairState) -> dict[str, Any]:
        return {"decision": keel.approval("manager", timeout="30d").decision}

    def build() -> StateGraph:
        g = StateGraph(PairState)
        g.add_node("pay", pay)
        g.add_node("ask", ask)
        g.add_edge(START, "pay")
        g.add_edge(START, "ask")
        g.add_edge("pay", END)
        g.add_edge("ask", END)
        return g

    app.workflow("pair")(build)
    run = app.submit("pair", job_id="pair-9", input={"amount": 5})["run_id"]
    assert execute(app, *claim(app, "worker-a")) == "lease_lost"
    clock.advance(app.aio.lease_ttl + 1)
    drain(app)
    details = app.get_run(run)
    assert details.status == "waiting"
    assert sorted(w["kind"] for w in details.waits) == ["approval", "effect"]
    assert len(provider.deliveries) == 1

    manager = next(w for w in details.waits if w["kind"] == "approval")
    app.approve(run, by="alice", wait_id=manager["wait_id"])  # the run is queued now
    clock.advance(7 * 86400 + 1)  # nobody answered the in-doubt effect within its 7 days

    async def sweep() -> int:

        return await app.aio.sweep()

    assert app.aio.portal.call(sweep()) == 1
    drain(app)
    assert len(provider.deliveries) == 1, "a deadline was taken as 'not performed'"
    assert app.get_run(run).status == "failed"  # the effect wait's policy: fail, timed out
