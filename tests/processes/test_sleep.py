"""Durable sleep under real `keel worker` processes: 50 runs sleeping 2-5 s across a worker's
SIGKILL and a PostgreSQL crash and restart (a throwaway cluster of this module's own). Every run
wakes, none before its wake time by the database's clock (whatever a worker's clock says: one
runs 30 s ahead), and no worker holds a sleeping run: no claim between a run's pause and its
wake on its timeline, and no lease on a waiting run whenever the test looks.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import keel
from keel.core.codec import loads
from keel.testing import spawn_worker
from keel.testing.pgcluster import ThrowawayCluster
from tests.support import REPO
from tests.support.apps import sleepers
from tests.support.checks import wait_until

APP = "tests.support.apps.sleepers:app"
RUNS = 50


def _up(cluster: ThrowawayCluster) -> None:
    if not cluster.ready():
        cluster.start()


class Sleepers:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.app = keel.App(url, artifacts_dir=tmp / "artifacts")
        self.app.aio.runtime.adopt(sleepers.app.aio.runtime.workflows)

    def start(self, clock_offset: str | None = None) -> subprocess.Popen[bytes]:
        proc = spawn_worker(
            APP,
            "--concurrency",
            "8",
            database_url=self.url,
            lease_ttl=2.0,
            clock_offset=clock_offset,
            artifacts_dir=self.tmp / "artifacts",
            cwd=REPO,
            log=self.tmp / f"worker-{len(self.procs)}.log",
        )
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("worker-*.log"))
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        self.app.close()


@pytest.fixture
def crew(cluster: ThrowawayCluster, tmp_path: Path) -> Iterator[Sleepers]:
    _up(cluster)
    url = cluster.create_database(f"keel_{uuid.uuid4().hex[:8]}")
    with keel.App(url) as app:
        app.migrate()
    made = Sleepers(url, tmp_path)
    try:
        yield made
    finally:
        _up(cluster)
        made.close()


def _no_lease_on_a_sleeping_run(app: keel.App) -> int:
    """Look once: every run with a pending timer is waiting and leaseless. How many sleep."""
    asleep = 0
    for row in app.list_runs(status="waiting", limit=RUNS):
        assert (row["lease_owner"], row["lease_expires_at"]) == (None, None), row
        asleep += 1
    return asleep


@pytest.mark.slow
@pytest.mark.postgres
def test_50_sleeping_runs_wake_on_time_across_a_worker_kill_and_a_postgres_restart(
    crew: Sleepers, cluster: ThrowawayCluster
) -> None:
    ids = [
        crew.app.submit("sleeper", {"seconds": 2 + (i % 4)}, job_id=f"nap-{i}").run_id
        for i in range(RUNS)
    ]
    doomed = crew.start()
    crew.start(clock_offset="30")  # its clock is ahead: it must not wake anyone early
    # Both past their preflight (one that cannot connect there exits: its contract).
    wait_until(lambda: len(crew.app.workers()) >= 2, 60, "both workers started")
    # Half of them asleep: the kill and the restart land while runs sleep.
    wait_until(lambda: _no_lease_on_a_sleeping_run(crew.app) >= RUNS // 2, 60, "runs asleep")
    crashed_at = crew.app.database_now()
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    cluster.kill()  # the postmaster; every connection breaks
    time.sleep(0.5)
    cluster.start()
    crew.start()
    seen_asleep = 0

    def all_completed() -> bool:
        nonlocal seen_asleep
        seen_asleep = max(seen_asleep, _no_lease_on_a_sleeping_run(crew.app))
        return all(r["status"] == "completed" for r in crew.app.list_runs(limit=RUNS))

    wait_until(all_completed, 60, "every run completed")
    assert seen_asleep > 0
    assert all(p.poll() is None for p in crew.procs[1:]), crew.logs()
    spanning = 0
    for run_id in ids:
        details = crew.app.get_run(run_id)
        [wait] = details.waits
        assert (wait["kind"], wait["status"], wait["decision"]) == ("timer", "expired", "woke")
        wake_at = float(wait["deadline"])
        spanning += float(wait["created_at"]) < crashed_at < wake_at
        slept = loads(details.run["input"])["seconds"]
        assert wake_at - float(wait["created_at"]) == pytest.approx(slept, abs=0.01)
        # By the database's clock: woken by the sweeper after its time, and the node went on
        # after that too.
        assert float(wait["decided_at"]) >= wake_at, (run_id, wait)
        assert float(details.output["woke_at"]) >= wake_at, (run_id, details.output, wait)
        # Nobody held it while it slept: no claim between its pause and its wake.
        kinds = [e["kind"] for e in details.timeline]
        paused, woke = kinds.index("status.waiting"), kinds.index("wait.expired")
        assert paused < woke, kinds
        assert not [k for k in kinds[paused:woke] if k.startswith("lease.")], kinds
    assert spanning >= RUNS // 4, f"only {spanning} runs slept through the crashes"
