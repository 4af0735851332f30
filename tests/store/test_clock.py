"""The database's clock decides: leases, deadlines and timelines follow `keel_now()`, whatever
the worker's own clock says; a test clock still drives it; a worker checks the two at start."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

import keel
from keel.core import leases
from keel.core.clock import judge_skew, parse_offset
from keel.runtime.worker import Worker
from tests.support.graphs import echo_graph

AppFactory = Callable[..., keel.App]
TWO_HOURS = 7200.0


def test_a_skewed_worker_clock_does_not_move_the_database_clock(make_app: AppFactory) -> None:
    app = make_app(clock=keel.SystemClock(offset=TWO_HOURS))
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="j-1", input={"text": "hi"})
    rt = app.aio.runtime
    before = time.time()
    database = rt.portal.call(app.aio.database_now())
    got = rt.portal.call(leases.claim(rt.store, "skewed", rt.workflows.keys(), 30))
    after = time.time()
    assert got is not None
    # Both are the host's (or server's) time, not the worker's two hours ahead: a bound, not
    # a timing (a PostgreSQL on this host shares its clock; allow it a minute of its own skew).
    assert before - 60 <= database <= after + 60
    row = app.get_run(run.run_id).run
    assert row["created_at"] <= row["lease_expires_at"] <= after + 60 + 30
    assert row["lease_expires_at"] < rt.clock.now(), "by the worker's clock it has expired"
    # ...and still nobody may take it over: the database says it is live.
    assert rt.portal.call(leases.claim(rt.store, "thief", rt.workflows.keys(), 30)) is None


def test_a_manual_clock_drives_the_database_clock_for_its_app(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    rt = app.aio.runtime
    assert rt.portal.call(app.aio.database_now()) == clock.now()
    clock.advance(3600)
    assert rt.portal.call(app.aio.database_now()) == clock.now()


def _worker(app: keel.App, limit: float | None) -> Worker:
    return Worker(app.aio.runtime, max_clock_skew=limit, stop_when_idle=True)


def test_a_worker_far_off_the_database_clock_refuses_to_start(make_app: AppFactory) -> None:
    app = make_app(clock=keel.SystemClock(offset=TWO_HOURS), lease_ttl=30)
    worker = _worker(app, None)  # the default limit, 300 s
    with pytest.raises(keel.ClockSkew, match=r"7\d{3}\.\d+ s ahead of the database's .*NTP"):
        app.aio.runtime.portal.call(worker.run())
    assert app.workers() == [], "a refused worker never announced itself"


def test_a_worker_off_by_more_than_a_third_of_the_ttl_warns_and_runs(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(clock=keel.SystemClock(offset=-20), lease_ttl=30)
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="j-1", input={"text": "hi"})
    with caplog.at_level(logging.WARNING, logger="keel.runtime.worker"):
        stats = app.aio.runtime.portal.call(asyncio.wait_for(_worker(app, 60).run(), 30))
    assert stats.finished == 1 and app.get_run(run.run_id).status == "completed"
    [warning] = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
    assert "behind the database's, more than a third of the lease TTL (30 s)" in warning


def test_an_honest_clock_is_silent(make_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(clock=keel.SystemClock(offset=0), lease_ttl=30)
    with caplog.at_level(logging.WARNING, logger="keel.runtime.worker"):
        app.aio.runtime.portal.call(asyncio.wait_for(_worker(app, None).run(), 30))
    assert not [r for r in caplog.records if "clock" in r.getMessage()]


def test_the_skew_rule_and_the_offset_setting() -> None:
    assert judge_skew(0.5, lease_ttl=3, limit=60) is None
    assert "1.500 s ahead" in str(judge_skew(1.5, lease_ttl=3, limit=60))
    assert judge_skew(7200, lease_ttl=3, limit=0) is not None  # 0: warn, never refuse
    with pytest.raises(keel.ClockSkew, match="limit 60 s"):
        judge_skew(-61, lease_ttl=3, limit=60)
    assert parse_offset(None) == parse_offset("") == 0
    assert parse_offset("-2h") == -7200 and parse_offset("+90s") == 90 == parse_offset("90")
    with pytest.raises(ValueError, match="KEEL_CLOCK_OFFSET='soon' is not a signed duration"):
        parse_offset("soon")
