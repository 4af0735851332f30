"""Schedules through the app: catch-up after an outage and overlap with an unfinished run, on
a test clock that drives the database's; declared schedules, thread schedules, the operations."""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Callable

import pytest

import keel
from keel.core.errors import UsageError
from keel.core.schedules import MAX_CATCH_UP, Tick
from keel.runtime.schedules import AsyncSchedules, fire_due
from keel.runtime.worker import Worker
from tests.support.graphs import echo_graph
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def _fire(app: keel.App) -> list[Tick]:
    rt = app.aio.runtime
    return rt.portal.call(fire_due(rt, rt.workflows))


def _app(make_app: AppFactory) -> tuple[keel.App, keel.ManualClock]:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    return app, clock


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [("latest", [600.0]), ("all", [60.0 * k for k in range(1, 11)]), ("none", [])],
)
def test_missed_ticks_follow_catch_up(
    make_app: AppFactory, catch_up: str, expected: list[float]
) -> None:
    app, clock = _app(make_app)
    start = clock.now()
    app.schedules.create(
        "m", "echo", every=60, input={"text": "t"}, catch_up=catch_up, overlap="allow"
    )
    clock.advance(630)  # ten ticks passed, the newest 30 s ago: an outage, not a late tick
    done = _fire(app)
    fired = [t for t in done if t.outcome == "fired"]
    assert [t.tick - start for t in fired] == expected
    assert all(t.run_id for t in fired) and len({t.run_id for t in fired}) == len(expected)
    # The ticks not fired are recorded as missed: "why did this tick not run?" has an answer.
    passed = [60.0 * k for k in range(1, 11)]
    missed = [tick for tick in passed if tick not in expected]
    assert [t.tick - start for t in done if t.outcome == "missed"] == missed
    recorded = {t["tick"] - start: t["outcome"] for t in app.schedules.ticks("m")}
    assert recorded == {t: "fired" if t in expected else "missed" for t in passed}
    assert app.schedules.get("m")["next_tick"] == start + 660, "no burst left for later"
    assert _fire(app) == []


def test_missed_ticks_recorded_are_capped(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    start = clock.now()
    app.schedules.create("l", "echo", every=1, input={"text": "t"}, catch_up="latest")
    clock.advance(1000)
    done = _fire(app)
    assert [t.outcome for t in done].count("fired") == 1
    missed = [t.tick - start for t in done if t.outcome == "missed"]
    assert missed == [float(k) for k in range(1000 - MAX_CATCH_UP + 1, 1000)], "the newest"
    assert len(app.schedules.ticks("l", limit=1000)) == MAX_CATCH_UP


def test_catch_up_none_still_fires_the_tick_of_now(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    start = clock.now()
    app.schedules.create("n", "echo", every=60, input={"text": "t"}, catch_up="none")
    clock.advance(61)
    assert [t.tick - start for t in _fire(app)] == [60.0]


def test_all_is_capped(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    app.schedules.create("a", "echo", every=1, input={"text": "t"}, catch_up="all", overlap="allow")
    clock.advance(1000)
    fired = _fire(app)
    assert len(fired) == MAX_CATCH_UP, "the newest ones"
    assert fired[-1].tick == clock.now()


def test_overlap_skip_records_the_skipped_tick(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    app.schedules.create("s", "echo", every=60, input={"text": "t"}, overlap="skip")
    clock.advance(60)
    (first,) = _fire(app)
    clock.advance(60)
    (second,) = _fire(app)
    assert (second.outcome, second.run_id) == ("skipped", None)
    drain(app)
    clock.advance(60)
    (third,) = _fire(app)
    assert third.outcome == "fired"
    outcomes = [(t["outcome"], t["run_id"]) for t in app.schedules.ticks("s")][::-1]
    assert outcomes == [("fired", first.run_id), ("skipped", None), ("fired", third.run_id)]


def test_overlap_enqueue_holds_ticks_until_the_previous_run_ends(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    start = clock.now()
    app.schedules.create("e", "echo", every=60, input={"text": "t"}, overlap="enqueue")
    clock.advance(60)
    (first,) = _fire(app)
    clock.advance(60)
    assert [t.outcome for t in _fire(app)] == ["queued"]
    clock.advance(60)
    assert [t.outcome for t in _fire(app)] == ["queued"]
    assert _fire(app) == [], "still held: the first run has not ended"
    assert app.schedules.get("e")["queued_ticks"] == 2
    drain(app)
    (second,) = _fire(app)
    assert (second.tick - start, second.outcome) == (120.0, "fired")
    drain(app)
    (third,) = _fire(app)
    assert third.tick - start == 180.0
    drain(app)
    assert app.schedules.get("e")["queued_ticks"] == 0
    runs = {app.get_run(t.run_id).run["status"] for t in (first, second, third) if t.run_id}
    assert runs == {"completed"}


def test_overlap_allow_fires_beside_an_unfinished_run(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    app.schedules.create("l", "echo", every=60, input={"text": "t"}, overlap="allow")
    clock.advance(60)
    (first,) = _fire(app)
    clock.advance(60)
    (second,) = _fire(app)
    assert second.outcome == "fired" and second.run_id != first.run_id
    assert app.get_run(str(first.run_id)).run["status"] == "queued"


def test_a_thread_schedule_starts_turns_of_the_thread(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    app.schedules.create(
        "t", "echo", every=60, input={"text": "x"}, thread_id="daily", overlap="allow"
    )
    for _ in range(2):
        clock.advance(60)
        _fire(app)
    drain(app)
    runs = app.thread_runs("daily")
    assert [r["status"] for r in runs] == ["completed", "completed"]


def test_deleting_a_thread_deletes_its_schedules(make_app: AppFactory) -> None:
    """As LangGraph's server deletes a thread's crons with it: no later tick makes it again."""
    app, clock = _app(make_app)
    app.schedules.create("t", "echo", every=60, input={"text": "x"}, thread_id="daily")
    app.schedules.create("free", "echo", every=60, input={"text": "x"})
    clock.advance(60)
    assert {t.outcome for t in _fire(app)} == {"fired"}
    drain(app)
    app.delete_thread("daily")
    clock.advance(600)
    assert {t.schedule for t in _fire(app)} == {"free"}
    with pytest.raises(keel.ThreadNotFound):
        app.get_thread("daily")
    assert [s["name"] for s in app.schedules.list()] == ["free"]


def test_a_schedule_that_requires_its_thread_is_refused_once_the_thread_is_deleted(
    make_app: AppFactory,
) -> None:
    """The Agent Server's cron on a thread it found: a deletion committed between its check
    and the schedule's insert left a cron whose tick made the deleted thread again. Judged in
    the insert's transaction, with the thread locked, it is refused and nothing fires."""
    app, clock = _app(make_app)
    app.create_thread(thread_id="daily", workflow="echo")
    made = app.schedules.create(
        "kept", "echo", every=60, input={"text": "x"}, thread_id="daily", require_thread=True
    )
    assert made["thread_id"] == "daily"
    app.delete_thread("daily")  # the deletion takes its schedule with it
    with pytest.raises(keel.ThreadNotFound):
        app.schedules.create(
            "late", "echo", every=60, input={"text": "x"}, thread_id="daily", require_thread=True
        )
    assert app.schedules.list() == []
    clock.advance(600)
    assert _fire(app) == []
    with pytest.raises(keel.ThreadNotFound):
        app.get_thread("daily")


def test_a_declared_schedule_is_upserted_at_worker_start(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    app.workflow(
        "nightly",
        schedule={"cron": "0 3 * * *", "timezone": "Europe/Paris", "input": {"text": "n"}},
    )(echo_graph)
    worker = Worker(app.aio.runtime, stop_when_idle=True)
    app.aio.runtime.portal.call(app.aio.schedules.declare(worker.serving))
    made = app.schedules.get("nightly")
    assert made["declared"] and made["cron"] == "0 3 * * *" and made["timezone"] == "Europe/Paris"
    clock.advance(3600)
    again = app.aio.runtime.portal.call(app.aio.schedules.declare(worker.serving))
    assert again[0]["next_tick"] == made["next_tick"], "unchanged timing keeps its next tick"
    drain(app, worker=worker)  # a worker's start declares too, and nothing is due


def test_operations_and_refusals(make_app: AppFactory) -> None:
    app, clock = _app(make_app)
    s = app.schedules.create("op", "echo", cron="*/1 * * * * *", input={"text": "t"})
    assert s["next_tick"] == clock.now() + 1
    with pytest.raises(keel.ScheduleExists):
        app.schedules.create("op", "echo", every=5, input={"text": "t"})
    for bad, match in [
        ({"cron": "61 * * * *"}, "not a valid cron"),
        ({"cron": "* * *"}, "5 fields"),
        ({"every": 5, "cron": "* * * * *"}, "either cron= or every="),
        ({"every": 0.5}, "from 1 to a century"),
        ({"every": 5, "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"every": 5, "catch_up": "some"}, "catch_up must be"),
    ]:
        with pytest.raises(UsageError, match=match):
            app.schedules.create("bad", "echo", input={"text": "t"}, **bad)  # type: ignore[arg-type]
    with pytest.raises(keel.UnknownWorkflow):
        app.schedules.create("bad", "nope", every=5)
    assert app.schedules.count() == 1
    paused = app.schedules.pause("op")
    assert paused["paused"] and paused["next_tick"] is None
    clock.advance(10)
    assert _fire(app) == [], "paused: nothing"
    resumed = app.schedules.resume(s["schedule_id"])
    assert resumed["next_tick"] == clock.now() + 1, "the ticks missed while paused are gone"
    changed = app.schedules.update("op", every=30, metadata={"team": "a"})
    assert (changed["cron"], changed["every"], changed["metadata"]) == (None, 30.0, {"team": "a"})
    tick = app.schedules.trigger("op")
    assert tick.outcome == "triggered" and app.get_run(str(tick.run_id)).run["status"] == "queued"
    app.schedules.delete("op")
    with pytest.raises(keel.ScheduleNotFound):
        app.schedules.get("op")
    assert app.get_run(str(tick.run_id)).run["job_id"].startswith("schedule.")


@pytest.mark.parametrize(
    "edit",
    [{"input": {"text": "b"}}, {"metadata": {"team": "a"}}, {"paused": False}],
    ids=["input", "metadata", "noop-resume"],
)
def test_an_edit_read_before_a_tick_fired_does_not_fire_that_tick_again(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch, edit: dict[str, object]
) -> None:
    """An edit reads the schedule, a worker fires a tick, the edit writes: it wrote its read's
    next tick back, and the tick fired again (with a new input, as a second run)."""
    app, clock = _app(make_app)
    app.schedules.create("e", "echo", every=60, input={"text": "a"}, overlap="allow")
    clock.advance(61)
    rt = app.aio.runtime
    read = AsyncSchedules._row
    meanwhile: list[Tick] = []

    async def read_then_a_tick_fires(self: AsyncSchedules, key: str) -> dict[str, object]:
        row = await read(self, key)
        meanwhile.extend(await fire_due(rt, rt.workflows))
        return row

    monkeypatch.setattr(AsyncSchedules, "_row", read_then_a_tick_fires)
    app.schedules.update("e", **edit)  # type: ignore[arg-type]
    monkeypatch.undo()
    assert [t.outcome for t in meanwhile] == ["fired"]
    assert app.schedules.get("e")["next_tick"] == meanwhile[0].tick + 60, "not put back"
    assert _fire(app) == [], "the fired tick is not due again"
    assert len(app.list_runs()) == 1


@pytest.mark.parametrize(
    ("night", "expected"),
    [
        # Autumn: 02:30 comes twice (03:00 CEST -> 02:00 CET); once, the first time.
        ((2026, 10, 24), ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]),
        # Spring: 02:30 never comes (02:00 CET -> 03:00 CEST); once, at the change.
        ((2026, 3, 28), ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]),
    ],
)
def test_a_daily_schedule_fires_once_on_a_dst_night(
    make_app: AppFactory, night: tuple[int, int, int], expected: list[str]
) -> None:
    """The database's clock walks two days in 15-minute steps through a DST change, a tick
    fired at each step: the 02:30 Paris schedule starts one run a day."""
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    start = datetime.datetime(*night, 12, 0, tzinfo=paris).timestamp()
    clock = keel.ManualClock(start=start)
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    app.schedules.create(
        "nightly",
        "echo",
        cron="30 2 * * *",
        timezone="Europe/Paris",
        input={"text": "n"},
        overlap="allow",
    )
    fired: list[Tick] = []
    for _ in range(2 * 24 * 4):
        clock.advance(900)
        fired += _fire(app)
    when = [datetime.datetime.fromtimestamp(t.tick, paris).isoformat() for t in fired]
    assert when == expected
    assert [t.outcome for t in fired] == ["fired", "fired"]
    assert len({t.run_id for t in fired}) == 2
