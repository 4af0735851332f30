"""Exactly one run per tick under real `keel worker` processes on PostgreSQL.

Three workers of a per-second cron (tests/support/apps/ticker.py), one of them 30 s ahead on
its own clock; every few seconds one of the others is SIGKILLed and started again. Every tick
of the time they ran has exactly one run (counted in the database by the tick's job id), none
fired before its time by the database's clock, none lost. Then every worker is killed for a few
seconds: on restart, `catch_up="latest"` makes one run for the ticks missed, not a burst.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import keel
from keel.testing import spawn_worker
from tests.support.checks import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

APP = "tests.support.apps.ticker:app"
LIVE = 16.0
"""Seconds the fleet runs, under kills, before the outage."""
KILL_EVERY = 4.0
OUTAGE = 5.0


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


def _tick_runs(app: keel.App) -> list[tuple[float, float, str]]:
    """(tick, fired_at, run_id) of the schedule's fired ticks, oldest first."""
    found = app.schedules.list()
    if not found:
        return []  # no worker has declared it yet
    ticks = app.schedules.ticks(found[0]["schedule_id"], limit=1000)
    return sorted((t["tick"], t["fired_at"], t["run_id"]) for t in ticks if t["outcome"] == "fired")


def test_one_run_per_tick_across_kills_skew_and_an_outage(
    db_url: str, tmp_path: Path, fleet: list[subprocess.Popen[bytes]]
) -> None:
    app = keel.App(db_url, artifacts_dir=tmp_path / "artifacts")

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
            lambda: sum(t > restarted for t, _, _ in _tick_runs(app)) >= 3,
            60,
            what="ticks after the restart",
        )
        for proc in fleet:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        ticks = _tick_runs(app)
    finally:
        app.close()

    # One run per tick: by the ticks' records and by the runs themselves (a job per tick).
    assert len({rid for _, _, rid in ticks}) == len(ticks)
    with keel.App(db_url, artifacts_dir=tmp_path / "artifacts") as reader:
        jobs = Counter(r["job_id"] for r in reader.list_runs(limit=10_000))
    assert set(jobs.values()) == {1} and len(jobs) == len(ticks), jobs.most_common(3)
    # None early by the database's clock (the skewed worker's clock said 30 s later).
    assert min(fired - tick for tick, fired, _ in ticks) >= 0
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
    missed = [t for t, _ in after if t <= first_fired]
    assert len(missed) == 1, missed
    assert [b - a for (a, _), (b, _) in itertools.pairwise(after)] == [1.0] * (len(after) - 1)
