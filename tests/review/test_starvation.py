"""Sync nodes vs. the connection pool: no cycle between threads and connections.

Sync nodes run in the event loop's thread pool (64 threads) and block there while their
effect's ledger writes wait for a pooled connection (PostgreSQL: 10). A fenced checkpoint
write that held a connection while waiting for a thread (LangGraph serializes writes in a
thread) closed the cycle: every thread waited for a connection, every connection for a thread,
until the pool timed out 30 s later and the run failed. The worker runs in a subprocess so that
a deadlock costs this test its timeout, not the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import keel
from tests.review.fanout_app import build

ROOT = Path(__file__).resolve().parents[2]
AppFactory = Callable[..., keel.App]
BRANCHES = 150  # more sync nodes than the pool has threads, in one step


def test_wide_fanout_of_sync_nodes_with_effects_does_not_deadlock_the_pool(
    make_app: AppFactory, db_url: str, tmp_path: Path
) -> None:
    app = make_app()
    app.workflow("fanout")(build)
    run = app.submit("fanout", job_id="wide-1", input={"n": BRANCHES})["run_id"]
    deliveries = tmp_path / "deliveries.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        KEEL_DATABASE_URL=db_url,
        KEEL_ARTIFACTS_DIR=str(tmp_path / "artifacts"),
        REVIEW_DELIVERIES=str(deliveries),
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "keel", "worker", "tests.review.fanout_app:app", "--stop-when-idle"],
        cwd=ROOT,
        env=env,
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
