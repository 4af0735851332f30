"""Many workers, one owner: workers SIGKILLed at random moments and restarted."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable

import pytest

import keel
from keel.testing import SmtpSink
from tests.support.apps import fleet
from tests.support.checks import assert_single_owner, wait_until


def _fleet(
    make_app: Callable[..., keel.App],
    spawn: Callable[..., subprocess.Popen[bytes]],
    sink: SmtpSink,
    *,
    runs: int,
    workers: int,
    seconds: float,
) -> None:
    app = make_app()
    app.workflow("ticket")(fleet.ticket)
    ids = [
        app.submit("ticket", job_id=f"t-{i}", input={"ticket": f"T{i}", "work": 0.02})["run_id"]
        for i in range(runs)
    ]
    rng = random.Random(7)
    procs = [spawn("--concurrency", "4") for _ in range(workers)]
    kills = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(r["status"] == "completed" for r in app.list_runs(limit=runs + 1)):
            break
        time.sleep(rng.uniform(0.3, 0.9))
        victim = rng.randrange(workers)
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(timeout=10)
        kills += 1
        procs[victim] = spawn("--concurrency", "4")
    wait_until(
        lambda: all(r["status"] == "completed" for r in app.list_runs(limit=runs + 1)),
        timeout=60,
        what="every run to complete",
    )
    # A worker SIGTERMed while still importing has nothing to drain but exits -15: wait for all.
    wait_until(
        lambda: {p.pid for p in procs} <= {w["pid"] for w in app.workers()},
        timeout=30,
        what="every worker to be up",
    )
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0
    assert kills >= 3, "the test must actually kill workers"
    per_ticket = Counter(m.message["X-Ticket"] for m in sink.messages)
    assert per_ticket == Counter({f"T{i}": 1 for i in range(runs)})
    takeovers = 0
    for run_id in ids:
        details = app.get_run(run_id)
        assert details.status == "completed"
        assert details.output["steps"] == ["analyze", "work", "send", "close", "archive"]
        assert_single_owner(details.timeline)
        takeovers += sum(e["kind"] == "lease.takeover" for e in details.timeline)
        assert [e["status"] for e in details.effects] in (["sent"], ["confirmed"])


@pytest.mark.slow
def test_random_sigkills_of_workers_never_double_send_or_lose_a_run(
    backend, make_app, spawn, sink
) -> None:
    """PostgreSQL: three workers (as on many machines); SQLite: two processes on one file."""
    if backend == "postgres":
        _fleet(make_app, spawn, sink, runs=100, workers=3, seconds=25)
    else:
        _fleet(make_app, spawn, sink, runs=40, workers=2, seconds=15)
