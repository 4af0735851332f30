"""A `keel worker` SIGKILLed between a sleep's wake and the end of its node: the next worker
re-runs the node, and the sleep already slept returns at once (no second timer, no second
wait); the run completes."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import keel
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps import wakers
from tests.support.checks import wait_until

pytestmark = pytest.mark.slow
APP = "tests.support.apps.wakers:app"


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Iterator[keel.App]:
    with keel.App(db_url, artifacts_dir=tmp_path / "artifacts") as made:
        made.aio.runtime.adopt(wakers.app.aio.runtime.workflows)
        yield made


def test_a_worker_killed_after_the_wake_leaves_a_sleep_that_returns_at_once(
    app: keel.App, db_url: str, tmp_path: Path
) -> None:
    marks, release = tmp_path / "marks", tmp_path / "release"
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        proc = spawn_worker(
            APP,
            *args,
            database_url=db_url,
            lease_ttl=1.0,
            artifacts_dir=tmp_path / "artifacts",
            cwd=REPO,
            env={"WAKERS_MARKS": str(marks), "WAKERS_RELEASE": str(release)},
            log=tmp_path / f"worker-{len(procs)}.log",
        )
        procs.append(proc)
        return proc

    def lines() -> list[str]:
        return marks.read_text().split() if marks.exists() else []

    try:
        run_id = app.submit("waker", {"seconds": 1}, job_id="wake-1").run_id
        first = start()
        # The node ran until its sleep, then again from its start after the wake.
        wait_until(lambda: lines() == ["start", "start", "woke"], 60, "the node past its wake")
        (timer,) = app.get_run(run_id).waits
        assert (timer["kind"], timer["decision"]) == ("timer", "woke")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        release.touch()
        second = start("--stop-when-idle")
        assert second.wait(timeout=60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    details = app.get_run(run_id)
    assert details.status == "completed"
    assert lines() == ["start", "start", "woke", "start", "woke"], "re-run, not asleep again"
    assert [(w["wait_id"], w["kind"], w["decision"]) for w in details.waits] == [
        (timer["wait_id"], "timer", "woke")
    ], "no second timer"
