"""Sync nodes vs. the connection pool: no cycle between threads and connections.

Sync nodes run in the event loop's thread pool (64 threads) and block there while their
effect's ledger writes wait for a pooled connection (PostgreSQL: 10). A fenced checkpoint
write that held a connection while waiting for a thread (LangGraph serializes writes in a
thread) closed the cycle: every thread waited for a connection, every connection for a thread,
until the pool timed out 30 s later and the run failed. The worker runs in a subprocess so that
a deadlock costs this test its timeout, not the suite.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import keel
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps.fanout import build

AppFactory = Callable[..., keel.App]
BRANCHES = 150  # more sync nodes than the pool has threads, in one step


def test_wide_fanout_of_sync_nodes_with_effects_does_not_deadlock_the_pool(
    make_app: AppFactory, db_url: str, tmp_path: Path
) -> None:
    app = make_app()
    app.workflow("fanout")(build)
    run = app.submit("fanout", job_id="wide-1", input={"n": BRANCHES})["run_id"]
    deliveries = tmp_path / "deliveries.txt"
    proc = spawn_worker(
        "tests.support.apps.fanout:app",
        "--stop-when-idle",
        database_url=db_url,
        artifacts_dir=tmp_path / "artifacts",
        env={"FANOUT_DELIVERIES": str(deliveries)},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _, err = proc.communicate(timeout=25)  # a deadlock lasts until the pool's 30 s timeout
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(
            "the worker deadlocked: threads and connections wait on each other"
        ) from None
    details = app.get_run(run)
    assert details.status == "completed", (details.run["error"], err.decode()[-2000:])
    assert sorted(details.output["out"]) == list(range(BRANCHES))
    lines = deliveries.read_text().split()
    assert len(lines) == BRANCHES and len(set(lines)) == BRANCHES
