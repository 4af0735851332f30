"""The loop-lag watchdog: a worker whose event loop an async node blocks (`time.sleep` in an
`async def`) says so while it happens and when it ends, naming the node, and records the block
on the run's timeline (fenced by the run's lease) for a claimer that gives the run up."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core.codec import dumps
from keel.core.leases import blocked_loop
from keel.runtime.watchdog import default_threshold
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


class S(TypedDict, total=False):
    x: int


def _graph(seconds: float) -> StateGraph:
    async def stuck(state: S) -> dict[str, Any]:
        time.sleep(seconds)  # noqa: ASYNC251 (the bug the watchdog is for)
        return {"x": 1}

    g = StateGraph(S)
    g.add_node("stuck", stuck)
    g.add_edge(START, "stuck")
    g.add_edge("stuck", END)
    return g


def test_an_async_node_blocking_the_loop_is_named_with_the_duration(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(lease_ttl=3.0)  # blocked past 1 s counts; the lease outlives this block
    app.workflow("stuck")(lambda: _graph(1.8))
    run_id = app.submit("stuck", job_id="j1", input={"x": 0}).run_id
    with caplog.at_level(logging.WARNING, logger="keel.runtime.watchdog"):
        stats = drain(app, concurrency=1)
    assert stats.finished == 1
    said = [r.getMessage() for r in caplog.records if r.name == "keel.runtime.watchdog"]
    during = [m for m in said if "so far" in m]
    after = [m for m in said if "so far" not in m]
    assert len(during) == 1 and len(after) == 1, said
    assert f"in node 'stuck' of run {run_id}" in during[0]
    assert "asyncio.to_thread" in during[0]
    assert "test_loop_watchdog.py" in during[0]  # where: the node's own function
    seconds = float(after[0].split("event loop blocked ", 1)[1].split(" s ", 1)[0])
    assert 1.4 <= seconds <= 2.6, after[0]
    assert f"in node 'stuck' of run {run_id}" in after[0]

    # Recorded on the run's timeline, under its lease, while the block lasted (by the
    # watchdog's own connection: the loop's were blocked).
    deadline = time.monotonic() + 10
    while True:
        timeline = app.get_run(run_id).timeline
        kinds = [e["kind"] for e in timeline]
        if "loop.blocked" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    blocked = [e for e in timeline if e["kind"] == "loop.blocked"]
    assert len(blocked) == 1, kinds
    assert blocked[0]["data"]["node"] == "stuck"
    assert blocked[0]["data"]["blocked_for"] >= 1.0
    assert kinds.index("loop.blocked") < kinds.index("status.completed")


def test_a_run_that_blocks_nothing_is_not_reported(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(lease_ttl=3.0)
    app.workflow("stuck")(lambda: _graph(0.05))
    run_id = app.submit("stuck", job_id="j1", input={"x": 0}).run_id
    with caplog.at_level(logging.WARNING, logger="keel.runtime.watchdog"):
        drain(app, concurrency=1)
    # Its own reports only: an earlier test's recording thread may still log that it could not
    # write to that test's database, dropped meanwhile.
    reports = [r.getMessage() for r in caplog.records if r.name == "keel.runtime.watchdog"]
    assert [m for m in reports if m.startswith("event loop blocked")] == []
    assert "loop.blocked" not in [e["kind"] for e in app.get_run(run_id).timeline]


def _row(kind: str, token: int, at: float, data: dict[str, Any], now: float = 110.0) -> dict:
    return {
        "kind": kind,
        "lease_token": token,
        "worker_id": "w",
        "at": at,
        "data": dumps(data),
        "now": now,
    }


def test_the_give_up_blames_only_a_block_its_lapsed_lease_did_not_survive() -> None:
    block = {"node": "stuck", "blocked_for": 1.0, "lease_ttl": 3.0}
    rows = [  # newest first
        _row("loop.blocked", 3, 101.0, block),
        _row("loop.unblocked", 2, 96.0, {"blocked_for": 1.5}),
        _row("loop.blocked", 2, 95.0, block),
        _row("loop.blocked", 1, 90.0, block),
    ]
    found = blocked_loop(rows, lapsed=3)
    assert found is not None
    assert (found.node, found.lasted, found.lease_ttl, found.times) == ("stuck", 10.0, 3.0, 2)
    text = found.describe(3)
    assert "the run's node 'stuck' blocked its worker's event loop for 10.0 s" in text
    assert "longer than its 3 s lease" in text and "2 of its 3 takeovers" in text
    assert blocked_loop(rows, lapsed=2) is None  # that block ended while the lease held
    assert blocked_loop(rows, lapsed=4) is None  # the lease that lapsed recorded no block
    bystander = [_row("loop.blocked", 5, 101.0, {**block, "by_run": "r-other"})]
    found = blocked_loop(bystander, lapsed=5)
    assert found is not None
    assert "blocked by node 'stuck' of run r-other" in found.describe(5)


def test_the_threshold_leaves_the_lease_time_to_record_a_block() -> None:
    assert default_threshold(30.0) == 5.0
    assert default_threshold(3.0) == 1.0
    assert default_threshold(1.0) == pytest.approx(1 / 3)
