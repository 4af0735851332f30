"""Delayed runs and durable sleep (issue 33), on both backends.

A delayed run is admitted at once and queued, but no claim takes it before its not-before time
by the database's clock, whatever a worker's own clock says. `keel.sleep()` parks a run on a
timer wait: no lease held, nobody can answer it, the sweeper wakes it once the database's clock
passes its wake time, and a cancel ends it without waking.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.core import leases
from keel.runtime.worker import Worker
from tests.support.graphs import echo_graph
from tests.support.workers import drain, sweep

AppFactory = Callable[..., keel.App]
TWO_HOURS = 7200.0


def _claim(app: keel.App, worker_id: str = "w-1") -> dict[str, Any] | None:
    rt = app.aio.runtime
    got = rt.portal.call(leases.claim(rt.store, worker_id, rt.workflows.keys(), rt.lease_ttl))
    return None if got is None else got[1]


def _due(app: keel.App) -> Any:
    rt = app.aio.runtime
    return rt.portal.call(rt.store.next_due(list(rt.workflows.keys()), outbox=False))


# -- delayed runs -------------------------------------------------------------------------------


def test_a_delayed_run_is_admitted_now_and_claimed_only_at_its_time(make_app: AppFactory) -> None:
    clock = keel.ManualClock()  # drives the database's clock on this app's connections
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    start = clock.now()
    delayed = app.submit("echo", {"text": "later"}, job_id="j-later", after=timedelta(minutes=1))
    at = app.submit("echo", {"text": "at"}, job_id="j-at", not_before=start + 30)
    row = app.get_run(delayed.run_id).run
    assert (row["status"], row["not_before"]) == ("queued", start + 60)
    assert app.get_run(at.run_id).run["not_before"] == start + 30
    # The idle worker's look knows when the first one falls due: no run to take before then.
    due = _due(app)
    assert (due.queued, due.lease_in) == (False, 30.0)
    assert "delayed" in app.summary(delayed.run_id).outcome
    assert _claim(app) is None
    clock.advance(29.9)
    assert _claim(app) is None
    clock.advance(0.1)  # its time exactly: not before, so now
    first = _claim(app)
    assert first is not None and first["run_id"] == at.run_id
    assert _claim(app, "w-2") is None
    clock.advance(30)
    second = _claim(app, "w-2")
    assert second is not None and second["run_id"] == delayed.run_id
    # A resubmission of the same job is the same run, its time unchanged.
    again = app.submit("echo", {"text": "later"}, job_id="j-later", after=3600)
    assert again.run_id == delayed.run_id and not again.created


def test_a_worker_clock_ahead_does_not_start_a_delayed_run_early(make_app: AppFactory) -> None:
    app = make_app(clock=keel.SystemClock(offset=TWO_HOURS))
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", {"text": "hi"}, job_id="j-skew", after=1.5)
    # Two hours past its time by this worker's clock; not yet by the database's.
    assert _claim(app) is None
    worker = Worker(app.aio.runtime, max_clock_skew=0, stop_when_idle=True)
    drain(app, worker=worker, within=30)
    row = app.get_run(run.run_id).run
    assert row["status"] == "completed"
    assert row["not_before"] >= row["created_at"] + 1.5
    assert row["started_at"] >= row["not_before"], "claimed before its time by the database"


def test_delayed_submit_refuses_bad_times(make_app: AppFactory) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    with pytest.raises(keel.KeelError, match="not both"):
        app.submit("echo", {}, after=5, not_before=datetime.now(UTC))
    with pytest.raises(keel.KeelError, match="negative"):
        app.submit("echo", {}, after=-1)
    with pytest.raises(keel.KeelError, match="timezone-aware"):
        app.submit("echo", {}, not_before=datetime.now())
    with pytest.raises(keel.KeelError, match="not a duration"):
        app.submit("echo", {}, after="soon")
    assert app.list_runs() == [], "a refused submission admits nothing"


class Turn(TypedDict, total=False):
    text: str
    log: Annotated[list[str], operator.add]


def turn_graph() -> StateGraph:
    def say(state: Turn) -> dict[str, Any]:
        return {"log": [state.get("text", "")]}

    g = StateGraph(Turn)
    g.add_node("say", say)
    g.add_edge(START, "say")
    g.add_edge("say", END)
    return g


def test_a_delayed_turn_keeps_its_place_on_its_thread(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("turns")(turn_graph)
    first = app.submit("turns", {"text": "one"}, thread_id="t-1", after="2m")
    second = app.submit("turns", {"text": "two"}, thread_id="t-1")
    assert _claim(app) is None, "the second turn waits for the delayed first"
    clock.advance(121)
    claimed = _claim(app)
    assert claimed is not None and claimed["run_id"] == first.run_id
    # Let a worker finish both (the first is running under w-1's lease: expire it).
    clock.advance(app.aio.runtime.lease_ttl + 1)
    drain(app)
    assert app.get_run(first.run_id).status == app.get_run(second.run_id).status == "completed"
    assert app.get_state("t-1").values["log"] == ["one", "two"]


# -- durable sleep ------------------------------------------------------------------------------


class Nap(TypedDict, total=False):
    before: Annotated[list[str], operator.add]
    after: Annotated[list[str], operator.add]


def napping_graph(calls: list[str]) -> Callable[[], StateGraph]:
    """One sync node that sleeps twice, then an async node that sleeps once."""

    def nap(state: Nap) -> dict[str, Any]:
        calls.append("nap")
        keel.sleep(60)
        calls.append("nap:woke-1")
        keel.sleep("2m")
        calls.append("nap:woke-2")
        return {"before": ["nap"]}

    async def rest(state: Nap) -> dict[str, Any]:
        calls.append("rest")
        await keel.asleep(timedelta(seconds=30))
        return {"after": ["rest"]}

    def build() -> StateGraph:
        g = StateGraph(Nap)
        g.add_node("nap", nap)
        g.add_node("rest", rest)
        g.add_edge(START, "nap")
        g.add_edge("nap", "rest")
        g.add_edge("rest", END)
        return g

    return build


def _pending(app: keel.App, run_id: str) -> list[dict[str, Any]]:
    return [w for w in app.get_run(run_id).waits if w["status"] == "pending"]


def test_sleep_parks_the_run_without_a_lease_and_wakes_at_its_time(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    calls: list[str] = []
    app = make_app(clock=clock)
    app.workflow("nap")(napping_graph(calls))
    run_id = app.submit("nap", {}, job_id="j-nap").run_id
    wake_ats = []
    for step, seconds in enumerate((60, 120, 30)):
        drain(app)
        row = app.get_run(run_id).run
        assert (row["status"], row["lease_owner"], row["lease_expires_at"]) == (
            "waiting",
            None,
            None,
        )
        [wait] = _pending(app, run_id)
        assert (wait["kind"], wait["name"]) == ("timer", "sleep")
        assert wait["deadline"] == pytest.approx(clock.now() + seconds)
        wake_ats.append(wait["deadline"])
        assert app.summary(run_id).outcome == "sleeping"
        assert app.pending_waits() == [], "nobody is asked to answer a timer"
        # Nobody answers a timer: approve, reject and resume are refused, nothing recorded.
        for answer in (app.approve, app.reject):
            with pytest.raises(keel.KeelError, match="timer"):
                answer(run_id, by="alice")
        assert _pending(app, run_id) == [wait]
        clock.advance(seconds - 1)
        assert sweep(app) == 0, f"sleep {step} woke early"
        clock.advance(2)
        assert sweep(app) == 1
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed"
    assert [(w["kind"], w["status"], w["decision"]) for w in details.waits] == [
        ("timer", "expired", "woke")
    ] * 3
    assert len({w["wait_id"] for w in details.waits}) == 3
    assert [w["deadline"] for w in details.waits] == wake_ats
    # The node re-runs from its start on each wake; each sleep already slept returns at once.
    assert calls == [
        "nap",
        "nap",
        "nap:woke-1",
        "nap",
        "nap:woke-1",
        "nap:woke-2",
        "rest",
        "rest",
    ]
    spans = [s.label for s in app.summary(run_id).spans if s.kind == "waiting"]
    assert spans == ["sleeping"] * 3


def test_a_run_cancelled_while_asleep_ends_without_waking(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    calls: list[str] = []
    app = make_app(clock=clock)
    app.workflow("nap")(napping_graph(calls))
    run_id = app.submit("nap", {}, job_id="j-cancel").run_id
    drain(app)
    assert app.get_run(run_id).status == "waiting"
    app.cancel(run_id, by="ops")
    clock.advance(3600)
    assert sweep(app) == 0
    drain(app)
    details = app.get_run(run_id)
    assert (details.status, details.run["termination_reason"]) == ("cancelled", "cancelled")
    [wait] = details.waits
    assert (wait["kind"], wait["status"], wait["decision"]) == ("timer", "expired", "cancelled")
    assert calls == ["nap"], "the sleeping node never ran again"


def sleepy_turn_graph() -> StateGraph:
    def think(state: Turn) -> dict[str, Any]:
        if state.get("text") == "slow":
            keel.sleep("10m")
        return {"log": [state.get("text", "")]}

    g = StateGraph(Turn)
    g.add_node("think", think)
    g.add_edge(START, "think")
    g.add_edge("think", END)
    return g


def test_a_thread_turn_sleeps_and_the_next_turn_waits_for_it(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("chat")(sleepy_turn_graph)
    slow = app.submit("chat", {"text": "slow"}, thread_id="t-s")
    quick = app.submit("chat", {"text": "quick"}, thread_id="t-s")
    drain(app)
    assert app.get_run(slow.run_id).status == "waiting"
    assert app.get_run(quick.run_id).status == "queued"
    with pytest.raises(keel.KeelError, match="timer"):
        app.resume("t-s", "wake up")
    clock.advance(601)
    assert sweep(app) == 1
    drain(app)
    assert app.get_run(slow.run_id).status == app.get_run(quick.run_id).status == "completed"
    assert app.get_state("t-s").values["log"] == ["slow", "quick"]
