"""An async node that blocks its worker's event loop (`time.sleep` in an `async def`) for three
lease TTLs: no process dies, yet every lease lapses and another worker takes the run over. Past
`max_attempts` takeovers the run ends failed saying the node blocked the loop (recorded on its
timeline by each blocked worker's watchdog while its lease still held), not that a worker
died; the workers say it in their logs too, and leave cleanly."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

import keel
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps import blocking

pytestmark = pytest.mark.slow

APP = "tests.support.apps.blocking:app"
LEASE_TTL = 3.0


def test_a_node_blocking_the_loop_fails_its_run_saying_so(db_url: str, tmp_path: Path) -> None:
    app = blocking.register(keel.App(db_url, artifacts_dir=tmp_path / "artifacts"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        run_id = app.submit("blocking", job_id="j1", input={"x": 0}).run_id
        for _ in range(2):
            procs.append(
                spawn_worker(
                    APP,
                    "--stop-when-idle",
                    database_url=db_url,
                    lease_ttl=LEASE_TTL,
                    artifacts_dir=tmp_path / "artifacts",
                    env={"KEEL_LOG_LEVEL": "warning"},
                    cwd=REPO,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
        deadline = time.monotonic() + 60
        while (details := app.get_run(run_id)).status not in ("failed", "completed"):
            assert time.monotonic() < deadline, details.timeline
            time.sleep(0.2)
        # Nobody died: both workers leave on their own once their blocks end.
        logs = []
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err.decode()
            logs.append(err.decode())

        assert (details.status, details.termination_reason) == ("failed", "execution_error")
        error = details.run["error"]
        assert "the run's node 'block' blocked its worker's event loop" in error, error
        assert f"longer than its {LEASE_TTL:g} s lease" in error
        assert "asyncio.to_thread" in error
        assert "worker died" not in error
        assert details.run["crash_count"] == blocking.MAX_ATTEMPTS
        kinds = [e["kind"] for e in details.timeline]
        assert kinds.count("lease.takeover") == blocking.MAX_ATTEMPTS
        failed = [e["data"] for e in details.timeline if e["kind"] == "attempt.failed"]
        assert [(d["cause"], d["attempt"]) for d in failed] == [
            ("blocked loop", blocking.MAX_ATTEMPTS)
        ]
        blocked = [e for e in details.timeline if e["kind"] == "loop.blocked"]
        assert len(blocked) >= blocking.MAX_ATTEMPTS  # each blocked attempt, under its token
        assert {e["data"]["node"] for e in blocked} == {"block"}
        assert len({e["lease_token"] for e in blocked}) == len(blocked)

        said = "\n".join(logs)
        assert f"so far in node 'block' of run {run_id}" in said, said
        totals = re.findall(rf"event loop blocked ([\d.]+) s in node 'block' of run {run_id}", said)
        assert totals and all(float(s) >= 2.5 * LEASE_TTL for s in totals), said
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        app.close()
