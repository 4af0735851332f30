"""One active run per thread, decided by the database: admissions on a thread are serialized
by its row, so racing submissions get their places and their strategy's verdict one at a time,
and the claim takes a run only when every run before it on its thread has finished."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import keel
from keel.core import leases
from keel.core.errors import ThreadBusy, UsageError
from tests.support.by_hand import WORKFLOW, one_node

AppFactory = Callable[..., keel.App]
RACERS = 20


def racing_submits(app: keel.App, strategy: str, n: int = RACERS) -> list[Any]:
    """`n` submissions on one thread sent at once (PostgreSQL: on as many pooled connections
    as the pool gives), each one's Submission or the exception it raised."""

    async def race() -> list[Any]:
        calls = [
            app.aio.submit(
                WORKFLOW, {"note": str(i)}, thread_id="t-race", multitask_strategy=strategy
            )
            for i in range(n)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    return app.aio.runtime.portal.call(race())


def claim(app: keel.App, worker_id: str) -> str | None:
    """The run a worker's claim takes now, if any."""

    async def go() -> str | None:
        rt = app.aio.runtime
        got = await leases.claim(rt.store, worker_id, rt.workflows.keys(), rt.lease_ttl)
        return None if got is None else got[0].run_id

    return app.aio.runtime.portal.call(go())


def test_racing_rejects_admit_exactly_one(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow(WORKFLOW)(one_node)
    app.migrate()
    results = racing_submits(app, "reject")
    admitted = [r for r in results if isinstance(r, keel.Submission)]
    refused = [r for r in results if isinstance(r, ThreadBusy)]
    assert len(admitted) == 1 and len(refused) == RACERS - 1, results
    assert all(r.active_run == admitted[0].run_id for r in refused)
    assert [r["run_id"] for r in app.thread_runs("t-race")] == [admitted[0].run_id]


def test_racing_enqueues_take_dense_places_in_one_order(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow(WORKFLOW)(one_node)
    app.migrate()
    results = racing_submits(app, "enqueue")
    assert all(isinstance(r, keel.Submission) for r in results), results
    runs = app.thread_runs("t-race")
    assert [r["thread_seq"] for r in runs] == list(range(1, RACERS + 1))
    assert {r["run_id"] for r in runs} == {r.run_id for r in results}


def test_the_claim_takes_a_threads_runs_one_at_a_time_in_order(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow(WORKFLOW)(one_node)
    app.migrate()
    first = app.submit(WORKFLOW, {"note": "1"}, thread_id="t-gate").run_id
    second = app.submit(WORKFLOW, {"note": "2"}, thread_id="t-gate").run_id
    other = app.submit(WORKFLOW, {"note": "x"}, thread_id="t-other").run_id
    assert claim(app, "w-1") == first
    # The second waits for the first; another thread's run does not.
    assert claim(app, "w-2") == other
    assert claim(app, "w-3") is None
    assert app.get_run(second).status == "queued"


def test_a_thread_belongs_to_one_workflow_and_bad_strategies_are_refused(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow(WORKFLOW)(one_node)
    app.workflow("other")(one_node)
    app.migrate()
    app.submit(WORKFLOW, {"note": "1"}, thread_id="t-own")
    with pytest.raises(UsageError, match="belongs to workflow"):
        app.submit("other", {"note": "2"}, thread_id="t-own")
    with pytest.raises(UsageError, match="multitask_strategy"):
        app.submit(WORKFLOW, {"note": "2"}, thread_id="t-own", multitask_strategy="later")
    with pytest.raises(keel.InvalidId):
        app.submit(WORKFLOW, {"note": "2"}, thread_id="../escape")
    assert len(app.thread_runs("t-own")) == 1  # nothing refused was written


def test_a_retried_submission_with_a_job_id_is_the_same_run_even_under_reject(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow(WORKFLOW)(one_node)
    app.migrate()
    first = app.submit(WORKFLOW, {"note": "1"}, thread_id="t-job", job_id="turn-1")
    again = app.submit(
        WORKFLOW, {"note": "1"}, thread_id="t-job", job_id="turn-1", multitask_strategy="reject"
    )
    assert (first.created, again.created) == (True, False)
    assert again.run_id == first.run_id
    assert len(app.thread_runs("t-job")) == 1
