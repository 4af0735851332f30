"""Schedules in the database: a tick is claimed, its run admitted and the schedule moved on in
one transaction, once however many schedulers race, by the database's clock."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import keel
from keel.core.clock import Clock
from keel.core.schedules import CLAIM_BATCH, Tick
from keel.runtime.schedules import fire_due
from tests.support.graphs import echo_graph

AppFactory = Callable[..., keel.App]


def _fire(app: keel.App) -> list[Tick]:
    rt = app.aio.runtime
    return rt.portal.call(fire_due(rt, rt.workflows))


def _app(make_app: AppFactory, clock: Clock) -> keel.App:
    app = make_app(clock=clock)
    app.workflow("echo")(echo_graph)
    return app


def _tick_runs(app: keel.App) -> Counter[str]:
    """Runs per job id among the schedules' runs: one job per tick."""
    return Counter(
        r["job_id"] for r in app.list_runs(limit=10_000) if r["job_id"].startswith("schedule.")
    )


def test_a_due_tick_fires_once_and_moves_the_schedule_on(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    app = _app(make_app, clock)
    made = app.schedules.create("every-10", "echo", every=10, input={"text": "t"})
    assert made["next_tick"] == clock.now() + 10
    assert _fire(app) == [], "not due yet by the database's clock"
    clock.advance(10)
    fired = _fire(app)
    assert [(t.outcome, t.tick) for t in fired] == [("fired", made["next_tick"])]
    assert _fire(app) == [], "the same tick again: nothing"
    after = app.schedules.get("every-10")
    assert after["next_tick"] == made["next_tick"] + 10
    assert after["last_tick"] == made["next_tick"] and after["last_run_id"] == fired[0].run_id
    run = app.get_run(str(fired[0].run_id)).run
    assert run["status"] == "queued" and run["workflow"] == "echo"
    assert app.schedules.ticks("every-10")[0]["run_id"] == fired[0].run_id


def test_a_stale_claim_cannot_admit_a_tick_twice(make_app: AppFactory) -> None:
    """A scheduler that saw the schedule before a tick fired (its row moved back here by hand)
    admits nothing more: the tick's record and its run's id are the database's refusal."""
    clock = keel.ManualClock()
    app = _app(make_app, clock)
    made = app.schedules.create("s", "echo", every=10, input={"text": "t"}, overlap="allow")
    clock.advance(10)
    assert len(_fire(app)) == 1
    rt = app.aio.runtime

    async def rewind() -> None:
        async with rt.store.transaction() as tx:
            row = await rt.store.read_schedule(tx, "s")
            assert row is not None
            await rt.store.write_schedule(tx, {**row, "next_tick": made["next_tick"]})

    rt.portal.call(rewind())
    assert _fire(app) == [], "the tick was recorded: no second outcome"
    assert list(_tick_runs(app).values()) == [1]


def test_concurrent_schedulers_fire_each_tick_once(make_app: AppFactory) -> None:
    clock = keel.ManualClock()
    apps = [_app(make_app, clock) for _ in range(4)]
    apps[0].schedules.create("busy", "echo", every=1, input={"text": "t"}, overlap="allow")
    apps[0].schedules.create("other", "echo", every=2, input={"text": "u"}, overlap="allow")
    fired: list[Tick] = []
    lock = threading.Lock()
    for _ in range(12):
        clock.advance(1)
        barrier = threading.Barrier(len(apps))

        def scheduler(app: keel.App, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            got = _fire(app)
            with lock:
                fired.extend(got)

        threads = [threading.Thread(target=scheduler, args=(a,)) for a in apps]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sorted(Counter((t.schedule, t.tick) for t in fired).values()) == [1] * 18
    runs = _tick_runs(apps[0])
    assert len(runs) == 18 and set(runs.values()) == {1}, "one run per tick in the database"


def test_a_worker_clock_ahead_does_not_fire_early(make_app: AppFactory) -> None:
    """The tick is judged by the database's clock: a host 30 s ahead sees it passed, and still
    fires nothing."""
    ahead = _app(make_app, keel.SystemClock(offset=30))
    made = ahead.schedules.create("soon", "echo", every=20, input={"text": "t"})
    assert made["next_tick"] < ahead.aio.runtime.clock.now(), "passed by the host's clock"
    assert _fire(ahead) == []
    assert ahead.schedules.ticks("soon") == []


def test_one_bad_schedule_holds_no_other_back(make_app: AppFactory) -> None:
    """A schedule that cannot fire (its thread belongs to another workflow) fails its own tick,
    recorded as failed, and moves on; a schedule of a workflow no worker here serves is left to
    the workers that do. The others fire, this pass and the next."""
    clock = keel.ManualClock()
    app = _app(make_app, clock)
    app.workflow("other")(echo_graph)
    app.submit("other", thread_id="theirs", input={"text": "x"})
    app.schedules.create("good", "echo", every=10, input={"text": "t"}, overlap="allow")
    app.schedules.create("bad", "echo", every=10, thread_id="theirs", overlap="allow")
    elsewhere = _app(make_app, clock)
    elsewhere.workflow("ghost")(echo_graph)
    elsewhere.schedules.create("ghost", "ghost", every=10, input={"text": "t"})
    for _ in range(2):
        clock.advance(10)
        fired = {(t.schedule, t.outcome) for t in _fire(app)}
        assert fired == {("good", "fired"), ("bad", "failed")}
    assert [t["outcome"] for t in app.schedules.ticks("bad")] == ["failed", "failed"]
    assert app.schedules.ticks("ghost") == [], "not a workflow of this scheduler's"
    assert len(_tick_runs(app)) == 2


def test_more_due_schedules_than_a_claim_takes_fire_each_tick_once(make_app: AppFactory) -> None:
    """Ticks due at once on more schedules than one claim takes are written a batch at a time:
    each fires once, its run admitted with one `admitted` event and its tick recorded with it;
    at the next tick a `skip` schedule whose run is still queued skips, an `allow` one fires."""
    clock = keel.ManualClock()
    app = _app(make_app, clock)
    n = CLAIM_BATCH + 10
    for i in range(n):
        overlap = "skip" if i % 2 else "allow"
        app.schedules.create(f"s{i:03d}", "echo", every=10, input={"text": str(i)}, overlap=overlap)
    rounds: list[list[Tick]] = []
    for _ in range(2):
        clock.advance(10)
        fired: list[Tick] = []
        while got := _fire(app):
            fired += got
        rounds.append(fired)
    assert Counter(t.outcome for t in rounds[0]) == {"fired": n}
    assert len({t.schedule for t in rounds[0]}) == n
    second = {t.schedule: t.outcome for t in rounds[1]}
    assert len(rounds[1]) == n == len(second)
    assert {o for s, o in second.items() if int(s[1:]) % 2} == {"skipped"}
    assert {o for s, o in second.items() if not int(s[1:]) % 2} == {"fired"}
    runs = _tick_runs(app)
    assert len(runs) == n + n // 2 and set(runs.values()) == {1}, "one run per fired tick"
    rt = app.aio.runtime
    for tick in rounds[0] + rounds[1]:
        if tick.run_id is None:
            continue
        kinds = [e["kind"] for e in rt.portal.call(rt.store.events(tick.run_id))]
        assert kinds == ["admitted"], tick
        assert app.get_run(tick.run_id).run["status"] == "queued"
    recorded = app.schedules.ticks("s000")
    assert [(t["outcome"], t["run_id"] is not None) for t in recorded] == [("fired", True)] * 2
    assert all(t["fired_at"] is not None for t in recorded)
    skipper = app.schedules.get("s001")
    first = next(t for t in rounds[0] if t.schedule == "s001")
    assert (skipper["last_tick"], skipper["last_run_id"]) == (first.tick, first.run_id)
    assert skipper["next_tick"] == first.tick + 20
