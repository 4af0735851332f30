"""A worker started with `prune_older_than` prunes old finished runs while it works."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import keel
from keel.core.errors import UsageError
from keel.runtime.worker import Worker
from tests.support.checks import wait_until
from tests.support.graphs import echo_graph
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def test_a_worker_prunes_old_finished_runs_on_its_schedule(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    old = app.submit("echo", job_id="old", input={"text": "a"})["run_id"]
    drain(app)
    clock.advance(3 * 86400)
    recent = app.submit("echo", job_id="recent", input={"text": "b"})["run_id"]
    worker = Worker(app.aio.runtime, prune_older_than="2d", prune_interval=3600)
    serving = asyncio.run_coroutine_threadsafe(worker.run(), app.aio.runtime.portal.loop)
    try:
        wait_until(
            lambda: (
                [r["run_id"] for r in app.list_runs()] == [recent]
                and app.get_run(recent).status == "completed"
            ),
            30,
            "the old run pruned and the recent one completed",
        )
    finally:
        app.aio.runtime.portal.loop.call_soon_threadsafe(worker.stop)
        serving.result(timeout=30)
    assert old not in [r["run_id"] for r in app.list_runs()]


def test_a_bad_prune_age_is_refused_before_the_worker_starts(make_app: AppFactory) -> None:
    app = make_app()
    with pytest.raises(UsageError, match="not a number"):
        Worker(app.aio.runtime, prune_older_than="monthly")


def test_a_worker_prunes_again_every_prune_every(make_app: AppFactory) -> None:
    """Runs that finish after the worker started are pruned by a later round, not only those
    already old at its start: the schedule repeats."""
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    worker = Worker(app.aio.runtime, prune_older_than="1d", prune_interval="0.2s")
    assert worker.prune_interval == 0.2
    serving = asyncio.run_coroutine_threadsafe(worker.run(), app.aio.runtime.portal.loop)
    try:
        first = app.submit("echo", job_id="first", input={"text": "a"})["run_id"]
        wait_until(lambda: app.get_run(first).status == "completed", 30, "the run completed")
        clock.advance(2 * 86400)
        wait_until(lambda: app.list_runs() == [], 30, "the run pruned by a later round")
    finally:
        app.aio.runtime.portal.loop.call_soon_threadsafe(worker.stop)
        serving.result(timeout=30)
    with pytest.raises(UsageError, match="not a number"):
        Worker(app.aio.runtime, prune_older_than="1d", prune_interval="hourly")
