"""A frozen worker (SIGSTOP past its lease) is fenced out when it wakes: it writes nothing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support.apps import fleet
from tests.support.checks import assert_single_owner, wait_until


@pytest.mark.slow
def test_sigstopped_worker_is_fenced_after_takeover(make_app, spawn, sink, tmp_path: Path) -> None:
    app = make_app()
    app.workflow("ticket")(fleet.ticket)
    run_id = app.submit("ticket", job_id="zombie", input={"ticket": "Z1", "work": 2.0})["run_id"]
    zombie = spawn()
    marker = tmp_path / "markers" / f"{run_id}.started"
    wait_until(marker.exists, timeout=30, what="the long step to start")
    zombie.send_signal(signal.SIGSTOP)
    try:
        time.sleep(1.5)  # past the 1 s lease TTL: no heartbeat can renew it
        rescuer = spawn("--stop-when-idle")
        assert rescuer.wait(timeout=60) == 0
        done = app.get_run(run_id)
        assert done.status == "completed"
        takeover = next(e for e in done.timeline if e["kind"] == "lease.takeover")
        stale = takeover["lease_token"] - 1
    finally:
        zombie.send_signal(signal.SIGCONT)
    # The zombie wakes inside its long step, then tries to write the step and send the email.
    time.sleep(3.0)
    after = app.get_run(run_id)
    assert after.status == "completed"
    late = [
        e
        for e in after.timeline
        if e["lease_token"] == stale and e["event_id"] > takeover["event_id"]
    ]
    assert late == [], f"the stale worker wrote after the takeover: {late}"
    assert all(e["lease_token"] != stale for e in after.effects)
    assert_single_owner(after.timeline)
    assert len(after.timeline) == len(done.timeline)
    assert sink.count(x_ticket="Z1") == 1
    zombie.send_signal(signal.SIGTERM)
    assert zombie.wait(timeout=30) == 0
    assert zombie.stderr is not None
    # It noticed (at its heartbeat or its next write) that it no longer owns the run.
    assert "lease" in zombie.stderr.read().decode()
