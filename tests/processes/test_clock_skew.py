"""Workers whose clocks run ahead steal no live lease and apply no deadline early.

Leases and deadlines are judged by the database's clock (`keel_now()` in the SQL). The skewed
workers here are real `keel worker` processes whose own clock is shifted by KEEL_CLOCK_OFFSET;
what the test counts is what the SMTP server received. On SQLite the database's clock is the
host's, which the offset does not touch either.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.support.apps import fleet
from tests.support.checks import assert_single_owner, wait_until

TTL = 3.0
RUNS = 4


@pytest.mark.slow
def test_fast_clocks_steal_no_live_lease_and_fire_no_deadline_early(
    make_app, spawn, sink, tmp_path: Path
) -> None:
    app = make_app()
    app.workflow("ticket")(fleet.ticket)
    app.workflow("gated")(fleet.gated)
    honest = spawn("--concurrency", str(RUNS + 1), lease_ttl=TTL)
    ids = [
        app.submit("ticket", job_id=f"t-{i}", input={"ticket": f"T{i}", "work": 3 * TTL})["run_id"]
        for i in range(RUNS)
    ]
    gated = app.submit("gated", job_id="g-1", input={"ticket": "G1"})["run_id"]
    markers = tmp_path / "markers"
    wait_until(
        lambda: all((markers / f"{r}.started").exists() for r in ids),
        timeout=30,
        what="the honest worker to hold every ticket's lease, mid-step",
    )
    wait_until(lambda: app.get_run(gated).status == "waiting", timeout=30, what="the approval")

    # 10 s ahead: past every 3 s lease by its own clock. 2 h ahead: past the 1 h deadline too
    # (it would be refused at start by default: the limit is lifted to show the clock is moot).
    fast = spawn("--concurrency", str(RUNS), lease_ttl=TTL, clock_offset="10")
    far = spawn(
        "--concurrency", str(RUNS), "--max-clock-skew", "0", lease_ttl=TTL, clock_offset="2h"
    )
    wait_until(
        lambda: {fast.pid, far.pid} <= {w["pid"] for w in app.workers()},
        timeout=30,
        what="both skewed workers to be up (claiming and sweeping every pass)",
    )
    wait_until(
        lambda: all(app.get_run(r).status == "completed" for r in ids),
        timeout=60,
        what="every ticket to complete",
    )

    # The skewed workers swept (once a second) the whole time the tickets worked.
    assert app.get_run(gated).status == "waiting", "a 1 h deadline fired early"
    [wait] = app.get_run(gated).waits
    assert wait["status"] == "pending"
    app.approve(gated, by="manager")
    wait_until(lambda: app.get_run(gated).status == "completed", timeout=30, what="the gate")

    for proc in (honest, fast, far):
        proc.send_signal(signal.SIGTERM)
    for proc in (honest, fast, far):
        assert proc.wait(timeout=30) == 0
    per_ticket = Counter(m.message["X-Ticket"] for m in sink.messages)
    assert per_ticket == Counter({**{f"T{i}": 1 for i in range(RUNS)}, "G1": 1})
    for run_id in ids:
        details = app.get_run(run_id)
        assert not [e for e in details.timeline if e["kind"] == "lease.takeover"]
        assert details.run["lease_token"] == 1, "a live lease was taken over"
        assert_single_owner(details.timeline)
    assert app.get_run(gated).decision == "approved"
    assert "ahead of the database's" in _stderr(fast), "the skewed worker did not warn"


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stderr is not None
    return proc.stderr.read().decode(errors="replace")


@pytest.mark.slow
def test_a_worker_hours_off_the_database_clock_refuses_to_start(spawn) -> None:
    refused = spawn(lease_ttl=TTL, clock_offset="-2h")
    assert refused.wait(timeout=60) == 1
    stderr = _stderr(refused)
    [line] = [line for line in stderr.splitlines() if line.startswith("error: ")] or [stderr]
    found = re.match(r"error: this host's clock is ([\d.]+) s behind the database's", line)
    assert found and abs(float(found[1]) - 7200) < 60, line  # measured over one round trip
    assert "(limit 300 s: --max-clock-skew or $KEEL_MAX_CLOCK_SKEW)" in line and "NTP" in line
