"""A run whose effect was left `pending` by a worker that lost its run, made in-process.

Worker A claims the run (token 1) and executes it with the worker's own executor. The effect's
first call stalls A past the lease TTL (the ManualClock moves) and another worker takes the run
over in that window (a real `leases.claim`, token 2), then dies too (its lease is left to
expire). A's effect either reached the provider or not; either way its `record` is fenced out
(LeaseLost), so the ledger row stays `pending`, exactly as after a crash between perform and
record. A worker's next claim (token 3) resumes the run from its last checkpoint, re-runs the
node and finds the key pending. Keel is never told what happened; only the provider knows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keel
from keel.core.effects.ledger import Effect
from tests.support.graphs import charge_effect, pay_graph
from tests.support.providers import Provider
from tests.support.workers import drain, execute_once, steal_lease

AppFactory = Callable[..., keel.App]


def stalled_pay(
    make_app: AppFactory,
    provider: Provider,
    *,
    clock: keel.ManualClock | None = None,
    **effect_options: Any,
) -> tuple[keel.App, str]:
    """Run a payment whose first charge stalls its worker past the lease; return app, run.

    `clock` is the ManualClock the app runs on (a new one unless the test wants to move it)."""
    clock = clock or keel.ManualClock()
    app = make_app(clock=clock, lease_ttl=30)

    async def stall(key: str) -> None:
        await steal_lease(app, clock)

    charge: Effect[..., Any] = charge_effect(provider, stall=stall, **effect_options)
    app.workflow("pay")(lambda: pay_graph(charge))
    run = app.submit("pay", job_id="order-1", input={"amount": 5})["run_id"]
    assert execute_once(app, "worker-a") == "lease_lost"
    clock.advance(app.aio.runtime.lease_ttl + 1)  # the thief died too
    drain(app)
    return app, run


def in_doubt(
    make_app: AppFactory,
    provider: Provider,
    *,
    delivered: bool,
    clock: keel.ManualClock | None = None,
) -> tuple[keel.App, str]:
    """A run waiting for a person to say whether its charge reached the provider."""
    app, run = stalled_pay(make_app, provider, clock=clock, deliver_before_stall=delivered)
    details = app.get_run(run)
    assert details.status == "waiting"
    [row] = details.effects
    assert row["status"] == "in_doubt"
    [wait] = details.waits
    assert (wait["kind"], wait["name"], wait["status"]) == ("effect", "charge", "pending")
    assert row["idempotency_key"] in wait["payload"]
    assert len(provider.calls) == 1  # never guessed: not sent a second time
    return app, run
