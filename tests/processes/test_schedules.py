"""Exactly one run per tick under real `keel worker` processes on PostgreSQL.

Three workers of a per-second cron (tests/support/apps/ticker.py), one of them 30 s ahead on
its own clock; every few seconds one of the others is SIGKILLed and started again. Every tick
of the time they ran has exactly one run (counted in the database by the tick's job id), none
fired before its time by the database's clock, none lost. Then every worker is killed for a few
seconds, and on restart each of three schedules of the same per-second cron follows its
`catch_up`: `latest` makes one run for the ticks missed, `all` one for each of them, `none` none;
the ticks not fired are recorded as missed.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.testing import spawn_worker
from tests.support.apps.ticker import build
from tests.support.checks import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

APP = "tests.support.apps.ticker:app"
LIVE = 16.0
"""Seconds the fleet runs, under kills, before the outage."""
KILL_EVERY = 4.0
OUTAGE = 5.0
NAMES = ("ticker", "ticker-all", "ticker-none")


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
def fleet(db_url: str, tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _ticks(app: keel.App, name: str, outcome: str) -> list[dict[str, Any]]:
    if not any(s["name"] == name for s in app.schedules.list()):
        return []  # no worker has declared it yet
    ticks = app.schedules.ticks(name, limit=1000)
    return sorted((t for t in ticks if t["outcome"] == outcome), key=lambda t: t["tick"])


def _tick_runs(app: keel.App, name: str = "ticker") -> list[tuple[float, float, str]]:
    """(tick, fired_at, run_id) of the schedule's fired ticks, oldest first."""
    return [(t["tick"], t["fired_at"], t["run_id"]) for t in _ticks(app, name, "fired")]


def test_one_run_per_tick_across_kills_skew_and_an_outage(
    db_url: str, tmp_path: Path, fleet: list[subprocess.Popen[bytes]]
) -> None:
    app = keel.App(db_url, artifacts_dir=tmp_path / "artifacts")
    app.workflow("ticker")(build)
    for policy in ("all", "none"):  # beside the declared `latest` one, on the same fleet
        app.schedules.create(
            f"ticker-{policy}",
            "ticker",
            cron="*/1 * * * * *",
            input={"n": 0},
            catch_up=policy,
            overlap="allow",
        )

    def start(offset: str | None = None) -> subprocess.Popen[bytes]:
        proc = spawn_worker(
            APP,
            "--concurrency",
            "4",
            database_url=db_url,
            artifacts_dir=tmp_path / "artifacts",
            clock_offset=offset,
            log=tmp_path / f"worker-{len(fleet)}.log",
        )
        fleet.append(proc)
        return proc

    try:
        skewed = start("30")  # never killed: it must fire no tick early, whatever its clock says
        killable = [start(), start()]
        wait_until(lambda: len(_tick_runs(app)) >= 2, 60, what="the fleet to fire ticks")
        began = app.database_now()
        kills = 0
        while app.database_now() - began < LIVE:
            time.sleep(KILL_EVERY)
            victim = killable[kills % 2]
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            killable[kills % 2] = start()
            kills += 1
        assert skewed.poll() is None
        for proc in fleet:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        stopped = app.database_now()
        before = _tick_runs(app)
        time.sleep(OUTAGE)
        restarted = app.database_now()
        start()
        start("30")
        wait_until(
            lambda: all(sum(t > restarted for t, _, _ in _tick_runs(app, n)) >= 3 for n in NAMES),
            60,
            what="ticks after the restart",
        )
        for proc in fleet:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        ticks = _tick_runs(app)
        every = _tick_runs(app, "ticker-all")
        nones = _tick_runs(app, "ticker-none")
        missed = {name: [t["tick"] for t in _ticks(app, name, "missed")] for name in NAMES}
    finally:
        app.close()

    # One run per tick: by the ticks' records and by the runs themselves (a job per tick).
    assert len({rid for _, _, rid in ticks}) == len(ticks)
    with keel.App(db_url, artifacts_dir=tmp_path / "artifacts") as reader:
        jobs = Counter(r["job_id"] for r in reader.list_runs(limit=10_000))
    assert set(jobs.values()) == {1}, jobs.most_common(3)
    assert len(jobs) == len(ticks) + len(every) + len(nones)
    # None early by the database's clock (the skewed worker's clock said 30 s later).
    assert min(fired - tick for tick, fired, _ in [*ticks, *every, *nones]) >= 0
    # None lost while workers ran: a tick each second from the first to the last before the
    # outage, through every kill.
    live = [t for t, _, _ in before]
    assert kills >= 3 and live[-1] - live[0] >= LIVE
    gaps = [b - a for a, b in itertools.pairwise(live) if b - a != 1.0]
    assert gaps == [], f"ticks lost or doubled between {live[0]} and {live[-1]}: {gaps}"
    # The outage: the ticks missed from the kill to the restart made one catch-up run.
    after = [(t, fired) for t, fired, _ in ticks if t > live[-1]]
    first_tick, first_fired = after[0]
    assert first_tick > stopped + OUTAGE - 2, "no run for the ticks missed, but the latest"
    # What was due when the catch-up fired: that tick, and at most the next one when a loaded
    # machine took over a second to fire it (a burst would be every tick of the outage).
    caught = [t for t, _ in after if t <= first_fired]
    assert 1 <= len(caught) <= 2, caught
    assert [b - a for (a, _), (b, _) in itertools.pairwise(after)] == [1.0] * (len(after) - 1)
    outage = [t for t in missed["ticker"] if live[-1] < t < first_tick]
    assert outage == [live[-1] + k for k in range(1, int(first_tick - live[-1]))], "each missed"
    # `all`: a run for each tick, the outage's included (fired late, on restart): no gap.
    alls = [t for t, _, _ in every]
    assert [b - a for a, b in itertools.pairwise(alls)] == [1.0] * (len(alls) - 1)
    late = [t for t, fired, _ in every if stopped < t < restarted and fired > restarted]
    assert len(late) >= OUTAGE - 1, late
    assert missed["ticker-all"] == []
    # `none`: no run for the outage's ticks; each of them recorded as missed.
    around = [t for t, _, _ in nones if t <= stopped][-1:] + [
        t for t, _, _ in nones if t > stopped
    ][:1]
    assert len(around) == 2, nones
    gap = [around[0] + k for k in range(1, int(around[1] - around[0]))]
    assert len(gap) >= OUTAGE - 1 and not any(stopped < t < restarted for t, _, _ in nones)
    assert [t for t in missed["ticker-none"] if around[0] < t < around[1]] == gap
