"""Nothing is stuck silently: a run whose node kills its worker process every time (OOM, a
segfault, os._exit) is not handed from worker to worker forever. Every takeover of an expired
lease counts a crashed attempt; past `max_attempts` the claimer ends the run failed instead of
executing it, and a stop-when-idle worker exits."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import keel
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps import poison

pytestmark = pytest.mark.slow

APP = "tests.support.apps.poison:app"


def test_a_run_that_kills_its_worker_every_time_ends_failed(db_url: str, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    app = poison.register(keel.App(db_url, artifacts_dir=tmp_path / "artifacts"))
    try:
        run_id = app.submit("poison", job_id="j1", input={"x": 1}).run_id
        deaths = 0
        deadline = time.monotonic() + 45
        while True:
            assert time.monotonic() < deadline, app.get_run(run_id).timeline
            proc = spawn_worker(
                APP,
                "--stop-when-idle",
                database_url=db_url,
                lease_ttl=1.0,
                artifacts_dir=tmp_path / "artifacts",
                env={"POISON_MARKERS": str(markers)},
                cwd=REPO,
            )
            code = proc.wait(timeout=30)
            if code == 0:
                break  # idle: the run is no longer claimable
            assert code == 137, code
            deaths += 1
            assert deaths <= poison.MAX_ATTEMPTS, app.get_run(run_id).timeline
        details = app.get_run(run_id)
        assert (details.status, details.termination_reason) == ("failed", "execution_error")
        assert f"worker died {poison.MAX_ATTEMPTS} times" in details.run["error"]
        assert details.run["crash_count"] == poison.MAX_ATTEMPTS
        # Each execution killed its worker; the one after the last death was never started.
        assert deaths == poison.MAX_ATTEMPTS
        assert (markers / "execs").read_text().count("x") == poison.MAX_ATTEMPTS
        kinds = [e["kind"] for e in details.timeline]
        assert kinds.count("lease.claimed") == 1
        assert kinds.count("lease.takeover") == poison.MAX_ATTEMPTS
        failed = [e["data"] for e in details.timeline if e["kind"] == "attempt.failed"]
        assert [(d["cause"], d["attempt"], d["limit"]) for d in failed] == [
            ("worker died", poison.MAX_ATTEMPTS, poison.MAX_ATTEMPTS)
        ]
    finally:
        app.close()
