"""SIGTERM drains: the running step finishes, the lease is given back, another worker resumes
at once (without waiting for the lease TTL), and nothing runs twice."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.apps import fleet
from tests.support.checks import assert_single_owner, wait_until


@pytest.mark.slow
def test_sigterm_finishes_the_step_and_releases_the_lease(
    make_app, spawn, sink, tmp_path: Path
) -> None:
    app = make_app()
    app.workflow("ticket")(fleet.ticket)
    run_id = app.submit("ticket", job_id="drain", input={"ticket": "D1", "work": 1.5})["run_id"]
    worker = spawn(lease_ttl=120)
    wait_until((tmp_path / "markers" / f"{run_id}.started").exists, 30, "the long step")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    released = app.get_run(run_id)
    assert released.status == "queued"
    assert released.run["lease_owner"] is None
    queued = [e for e in released.timeline if e["kind"] == "status.queued"]
    assert queued and queued[-1]["data"]["reason"] == "worker stopping"
    steps = [e["data"]["node"] for e in released.timeline if e["kind"] == "step"]
    assert "work" in steps, "the running step finished before the worker let go"

    started = time.monotonic()
    successor = spawn("--stop-when-idle", lease_ttl=120)
    assert successor.wait(timeout=60) == 0
    assert time.monotonic() - started < 60, "the successor must not wait for the TTL"
    done = app.get_run(run_id)
    assert done.status == "completed"
    assert done.output["steps"] == ["analyze", "work", "send", "close", "archive"]
    assert [e["data"]["node"] for e in done.timeline if e["kind"] == "step"].count("work") == 1
    assert_single_owner(done.timeline)
    assert sink.count(x_ticket="D1") == 1
