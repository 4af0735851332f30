"""Effects left `pending` by a worker that lost its run: reconcile, retry by key, or ask a
person, and use that person's answer once, never replayed into a second send.

The crash is made in-process and honestly (tests/support/in_doubt.py): the effect's call stalls
its worker past the lease (a ManualClock moves) while another worker takes the run over with a
real claim, so the stale worker's `record` is fenced out and the ledger row keeps its earlier
status — exactly what a SIGKILL between the provider call and the record leaves behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.errors import UsageError
from tests.support.graphs import echo_graph, pay_graph
from tests.support.in_doubt import in_doubt, stalled_pay
from tests.support.providers import Provider
from tests.support.workers import claim, drain, execute, steal_lease, sweep

AppFactory = Callable[..., keel.App]


def tokens_of(app: keel.App, run: str, kind: str) -> list[int]:
    return [e["lease_token"] for e in app.get_run(run).timeline if e["kind"] == kind]


def test_stale_worker_cannot_record_its_effect_after_a_takeover(make_app: AppFactory) -> None:
    """The premise of this module: the stale worker's outcome never reaches the ledger."""
    provider = Provider()
    app, run = stalled_pay(make_app, provider)
    details = app.get_run(run)
    assert tokens_of(app, run, "lease.takeover") == [2, 3]
    # Nothing the stale worker (token 1) did after the takeover was written.
    assert all(e["lease_token"] in (None, 1, 2, 3) for e in details.timeline)
    assert not [
        e for e in details.timeline if e["lease_token"] == 1 and e["kind"].startswith("effect.")
    ]
    assert provider.deliveries == provider.calls  # it did reach the provider


def test_reconciler_finding_the_effect_confirms_it_without_calling_again(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    app, run = stalled_pay(make_app, provider, reconcile=True)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.calls) == 1 and len(provider.deliveries) == 1
    [row] = details.effects
    assert row["status"] == "confirmed"
    assert row["idempotency_key"] == provider.calls[0]
    assert details.output["receipt"] == provider.results[provider.calls[0]]
    assert details.waits == []


def test_reconciler_saying_never_happened_performs_it_once(make_app: AppFactory) -> None:
    provider = Provider()
    app, run = stalled_pay(make_app, provider, reconcile=True, deliver_before_stall=False)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1  # same key both times
    assert provider.deliveries == provider.calls[:1]
    [row] = details.effects
    assert (row["status"], row["idempotency_key"]) == ("sent", provider.calls[0])
    reconciled = [e["data"] for e in details.timeline if e["kind"] == "effect.reconciled"]
    assert reconciled == [{"key": row["idempotency_key"], "found": False}]


def test_provider_idempotent_effect_is_retried_under_the_same_key(make_app: AppFactory) -> None:
    provider = Provider(dedupe=True)
    app, run = stalled_pay(make_app, provider, provider_idempotent=True)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1
    assert len(provider.deliveries) == 1  # the provider deduplicated the retry by key
    [row] = details.effects
    assert row["status"] == "sent"
    assert details.output["receipt"] == provider.results[row["idempotency_key"]]


def test_effect_neither_reconcilable_nor_idempotent_waits_for_a_person(
    make_app: AppFactory,
) -> None:
    app, run = in_doubt(make_app, Provider(), delivered=True)
    # Waiting holds no worker: another worker pass leaves it alone.
    drain(app)
    assert app.get_run(run).status == "waiting"


def test_resolving_in_doubt_as_performed_completes_without_calling_again(
    make_app: AppFactory,
) -> None:
    provider = Provider()
    app, run = in_doubt(make_app, provider, delivered=True)
    resolved = app.resolve_effect(run, performed=True, result={"id": "p-1", "by": "support"})
    assert resolved.recorded
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.calls) == 1 and len(provider.deliveries) == 1
    [row] = details.effects
    assert row["status"] == "confirmed"
    assert details.output["receipt"] == {"id": "p-1", "by": "support"}
    assert details.decision == "not_decided"  # resolving an effect is not an approval


def test_resolving_in_doubt_as_not_performed_performs_it_once(make_app: AppFactory) -> None:
    provider = Provider()
    app, run = in_doubt(make_app, provider, delivered=False)
    app.resolve_effect(run, performed=False)
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert len(provider.calls) == 2 and len(set(provider.calls)) == 1
    assert provider.deliveries == provider.calls[:1]
    [row] = details.effects
    assert row["status"] == "sent"
    drain(app)  # nothing left to do, nothing performed again
    assert len(provider.calls) == 2


@pytest.mark.parametrize("performed", [True, False])
def test_second_resolution_of_an_in_doubt_effect_changes_nothing(
    make_app: AppFactory, performed: bool
) -> None:
    provider = Provider()
    app, run = in_doubt(make_app, provider, delivered=performed)
    first = app.resolve_effect(run, performed=performed, by="alice")
    second = app.resolve_effect(run, performed=not performed, by="bob")
    assert (first.recorded, second.recorded) == (True, False)
    assert second.wait["decided_by"] == "alice"
    drain(app)
    assert len(provider.deliveries) == 1


def test_approving_an_in_doubt_effect_is_refused_and_does_not_send_it_again(
    make_app: AppFactory,
) -> None:
    """`approve` is not an answer to "did the charge reach the provider?".

    Taken as one, the effect's wait resumes without `performed` and the effect is performed
    again: a second charge, exactly what an in-doubt wait exists to prevent.
    """
    provider = Provider()
    app, run = in_doubt(make_app, provider, delivered=True)
    before = app.get_run(run)
    for answer in (app.approve, app.reject):
        with pytest.raises(UsageError, match="resolve_effect"):
            answer(run, by="alice")
    after = app.get_run(run)
    assert (after.run, after.timeline, after.waits) == (before.run, before.timeline, before.waits)
    drain(app)
    assert len(provider.deliveries) == 1
    assert app.get_run(run).status == "waiting"


def test_resolve_effect_on_an_approval_wait_is_refused(make_app: AppFactory) -> None:
    app = make_app()

    def review(state: dict[str, Any]) -> dict[str, Any]:
        return {"receipt": keel.approval("manager").decision}

    app.workflow("review")(lambda: echo_graph(review))  # type: ignore[arg-type]
    run = app.submit("review", job_id="r-1", input={})["run_id"]
    drain(app)
    with pytest.raises(UsageError, match=r"approve\(\) or reject\(\)"):
        app.resolve_effect(run, performed=True)
    assert app.get_run(run).waits[0]["status"] == "pending"


# -- a person's answer is used once ---------------------------------------------------------


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
            await steal_lease(app, clock)  # this worker is now stale: its record is fenced out
            if result is None:
                raise ConnectionResetError("reset before the provider answered")
            return result
        return provider.deliver(idempotency_key, amount)

    app.workflow("pay")(lambda: pay_graph(keel.effect("charge")(charge)))
    run = app.submit("pay", job_id="order-9", input={"amount": 5})["run_id"]

    # 1. The first call never reached the provider; the worker lost the run mid-call.
    assert execute(app, *claim(app, "worker-a")) == "lease_lost"
    clock.advance(app.aio.runtime.lease_ttl + 1)
    drain(app)
    details = app.get_run(run)
    assert details.status == "waiting" and [e["status"] for e in details.effects] == ["in_doubt"]
    assert provider.deliveries == []

    # 2. A person checks the provider and rightly says: not performed.
    app.resolve_effect(run, performed=False, by="support")

    # 3. The resumed worker performs it (delivery 1) and dies before recording it.
    clock.advance(app.aio.runtime.lease_ttl + 1)
    assert execute(app, *claim(app, "worker-b")) == "lease_lost"
    assert len(provider.deliveries) == 1

    # 4. The next worker must not act on the same old answer again.
    clock.advance(app.aio.runtime.lease_ttl + 1)
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


def test_resumed_after_its_in_doubt_wait_timed_out_asks_a_person_again(
    make_app: AppFactory,
) -> None:
    """Nobody answered within the in-doubt wait's deadline: the run fails (timed out). Resumed,
    it must neither fail again on that same expiry nor guess: a fresh wait asks a person."""
    provider = Provider()
    clock = keel.ManualClock()
    app, run = in_doubt(make_app, provider, delivered=True, clock=clock)
    [expired] = app.get_run(run).waits
    clock.advance(7 * 86400 + 1)
    assert sweep(app) == 1
    details = app.get_run(run)
    assert (details.status, details.termination_reason) == ("failed", "timed_out")

    app.resume(run, by="ops")
    drain(app)
    details = app.get_run(run)
    assert details.status == "waiting", details.run.get("error")
    assert [e["status"] for e in details.effects] == ["in_doubt"]
    [old, fresh] = sorted(details.waits, key=lambda w: w["wait_id"] != expired["wait_id"])
    assert (old["wait_id"], old["status"]) == (expired["wait_id"], "expired")
    assert (fresh["kind"], fresh["status"]) == ("effect", "pending")
    resumed = [e["data"] for e in details.timeline if e["data"].get("reason") == "resumed"]
    assert [e.get("reopened_waits") for e in resumed] == [[expired["wait_id"]]]

    resolved = app.resolve_effect(run, performed=True, result={"id": "p-1"}, by="support")
    assert resolved.wait["wait_id"] == fresh["wait_id"]
    drain(app)
    details = app.get_run(run)
    assert details.status == "completed"
    assert details.output["receipt"] == {"id": "p-1"}
    assert [e["status"] for e in details.effects] == ["confirmed"]
    assert len(provider.calls) == 1 and len(provider.deliveries) == 1  # sent once, in all


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
            await steal_lease(app, clock)  # delivered, but the record is fenced out: in doubt
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
    clock.advance(app.aio.runtime.lease_ttl + 1)
    drain(app)
    details = app.get_run(run)
    assert details.status == "waiting"
    assert sorted(w["kind"] for w in details.waits) == ["approval", "effect"]
    assert len(provider.deliveries) == 1

    manager = next(w for w in details.waits if w["kind"] == "approval")
    app.approve(run, by="alice", wait_id=manager["wait_id"])  # the run is queued now
    clock.advance(7 * 86400 + 1)  # nobody answered the in-doubt effect within its 7 days

    assert sweep(app) == 1
    drain(app)
    assert len(provider.deliveries) == 1, "a deadline was taken as 'not performed'"
    assert app.get_run(run).status == "failed"  # the effect wait's policy: fail, timed out
