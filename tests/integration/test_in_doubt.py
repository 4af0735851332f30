"""Effects left `pending` by a worker that lost its run: reconcile, retry by key, or ask.

How the pending row is made, honestly and in-process: worker A claims the run (token 1) and
executes it with the worker's own executor. The effect's first call stalls A past the lease
TTL (the ManualClock moves) and another worker takes the run over in that window (a real
`leases.claim`, token 2), then dies too (its lease is left to expire). A's effect either
reached the provider or not; either way its `record` is fenced out (LeaseLost), so the ledger
row stays `pending`, exactly as after a crash between perform and record. A worker's next
claim (token 3) resumes the run from its last checkpoint, re-runs the node and finds the key
pending: the path under test. Keel is never told what happened; only the provider knows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import keel
from keel.core.errors import UsageError
from keel.core.ledger import Effect
from tests.integration.graphs import (
    Provider,
    charge_effect,
    drain,
    echo_graph,
    execute_once,
    pay_graph,
    steal_lease,
)

AppFactory = Callable[..., keel.App]


def stalled_pay(
    make_app: AppFactory, provider: Provider, **effect_options: Any
) -> tuple[keel.App, str]:
    """Run a payment whose first charge stalls its worker past the lease; return app, run."""
    clock = keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=30)

    async def stall(key: str) -> None:
        await steal_lease(app, clock)

    charge: Effect[..., Any] = charge_effect(provider, stall=stall, **effect_options)
    app.workflow("pay")(lambda: pay_graph(charge))
    run = app.submit("pay", job_id="order-1", input={"amount": 5})["run_id"]
    assert execute_once(app, "worker-a") == "lease_lost"
    clock.advance(app.aio.lease_ttl + 1)  # the thief died too
    drain(app)
    return app, run


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


def in_doubt(make_app: AppFactory, provider: Provider, *, delivered: bool) -> tuple[keel.App, str]:
    app, run = stalled_pay(make_app, provider, deliver_before_stall=delivered)
    details = app.get_run(run)
    assert details.status == "waiting"
    [row] = details.effects
    assert row["status"] == "in_doubt"
    [wait] = details.waits
    assert (wait["kind"], wait["name"], wait["status"]) == ("effect", "charge", "pending")
    assert row["idempotency_key"] in wait["payload"]
    assert len(provider.calls) == 1  # never guessed: not sent a second time
    return app, run


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
