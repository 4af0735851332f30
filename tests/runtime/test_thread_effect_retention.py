"""Retention and a thread's `key=` effects: the record of a call the thread's runs share outlives
the run that made it for as long as the thread exists (docs/threads.md).

On a thread, an effect declared with `key=` is keyed by the thread and the named arguments, so
every later turn that calls it with the same values is served the first call's record. Pruning
the run that made the call must not forget it: the next turn would call the provider again (a
card charged twice). Deleting the thread ends its scope. The providers count what the outside
world saw; the ledger is read with the database's own driver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keel
from keel.core.clock import ManualClock
from tests.support.providers import Provider
from tests.support.thread_effects import ledger, runs_left, shop
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]
DAY = 86400.0
ORDER = {"order_id": "o-17", "amount": 40}


def turn(app: keel.App, thread_id: str | None = None, order: Any = ORDER, **options: str) -> str:
    """One order on `thread_id` (None: a run of its own) to its end; its run id."""
    run_id = app.submit("shop", order, thread_id=thread_id, **options).run_id
    drain(app)
    assert app.get_run(run_id).status == "completed"
    return run_id


def test_a_threads_key_effect_outlives_its_pruned_run_and_goes_with_the_thread(
    make_app: AppFactory, db_url: str
) -> None:
    clock = ManualClock()
    charges, mails = Provider(), Provider()
    app = make_app(clock=clock)
    app.workflow("shop")(shop(charges, mails))
    first = turn(app, "t-shop")
    solo = turn(app, job_id="solo")  # no thread: its keys are its run's, `key=` or not
    assert len(charges.deliveries) == len(mails.deliveries) == 2
    [kept] = [k for k, (name, run) in ledger(db_url).items() if (name, run) == ("charge", first)]

    clock.advance(2 * DAY)
    report = app.prune(older_than="1d")
    assert sorted(report.run_ids) == sorted([first, solo])
    assert runs_left(db_url, [first, solo]) == []

    # The thread's next turn asks for the same order: served the record, never charged again.
    second = turn(app, "t-shop")
    assert len(charges.deliveries) == 2 and charges.deliveries.count(kept) == 1
    assert len(mails.deliveries) == 3  # a receipt is every turn's (no `key=`)
    assert app.get_state("t-shop").values["charges"] == ["p-1", "p-1"]
    assert {k: row for k, row in ledger(db_url).items() if row[1] != second} == {
        kept: ("charge", first)
    }
    assert report.rows["effects"] == 3  # both receipts and the threadless run's charge
    assert [e["name"] for e in app.get_run(second).effects] == ["receipt"]

    # Deleting the thread ends its scope: the kept record goes, the second run's own row stays
    # with its run until retention prunes it.
    app.delete_thread("t-shop")
    assert sorted(name for name, _ in ledger(db_url).values()) == ["receipt"]
    # A new thread of that name is a new scope: its charge is a first call.
    third = turn(app, "t-shop")
    assert len(charges.deliveries) == 3
    assert app.get_state("t-shop").values["charges"] == ["p-3"]
    clock.advance(2 * DAY)
    assert sorted(app.prune(older_than="1d").run_ids) == sorted([second, third])
    assert [name for name, run in ledger(db_url).values()] == ["charge"]  # the new thread's


def test_a_kept_record_is_served_to_a_fork_after_its_run_is_pruned(
    make_app: AppFactory, db_url: str
) -> None:
    """A fork from before the charge, on a thread whose charging run was pruned, is served the
    record too; the pruned run's checkpoints stay with the thread (docs/threads.md)."""
    clock = ManualClock()
    charges, mails = Provider(), Provider()
    app = make_app(clock=clock)
    app.workflow("shop")(shop(charges, mails))
    turn(app, "t-fork")
    [start] = [h for h in app.get_history("t-fork") if h.next == ("pay",)]
    clock.advance(2 * DAY)
    assert app.prune(older_than="1d").runs == 1
    fork = str(start.config["configurable"]["checkpoint_id"])
    turn(app, "t-fork", None, checkpoint_id=fork)
    assert len(charges.deliveries) == 1
    assert len(mails.deliveries) == 2
    assert app.get_state("t-fork").values["charges"] == ["p-1"]
