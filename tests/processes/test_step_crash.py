"""A worker SIGKILLed between a parallel task finishing and its step's checkpoint.

With one fenced transaction per step, a finished task's writes wait for the checkpoint of its
step: a crash there loses them, and the step runs again. Its effects come from the ledger: the
outside world (the fan-out app's delivery file, one line per delivery) sees each one once.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps.fanout import build

pytestmark = pytest.mark.slow

AppFactory = Callable[..., keel.App]
BRANCHES = 3
# checkpoint.before_write occurrences of a 3-way fan-out: 1 the input's writes, 2 the checkpoint
# before the fan-out (the input's own checkpoint commits with it: the admitted input is durable
# already), 3-5 each branch's writes as it finishes (buffered for the step's checkpoint), 6 that
# checkpoint. 5: every branch has performed and recorded its effect and finished, two are
# buffered, the third finishing; the step is not committed. (An earlier kill may catch a branch
# between its provider call and its record: an in-doubt effect, which waits for a person,
# tests/processes/test_crashes.py.)
KILL_AT = "checkpoint.before_write@5"
FIRST_COMMIT = "checkpoint.before_write@2"
"""Just before the first transaction of the run's first execution: nothing of it is durable
but its admission (its input's checkpoint waits for this transaction)."""


def _common(db_url: str, tmp_path: Path, deliveries: Path) -> dict[str, Any]:
    return {
        "database_url": db_url,
        "artifacts_dir": tmp_path / "artifacts",
        "env": {"FANOUT_DELIVERIES": str(deliveries), "KEEL_LOG_LEVEL": "warning"},
        "cwd": REPO,
        "lease_ttl": 1.0,
        "log": tmp_path / "workers.log",
    }


def _killed_at(faults: str, common: dict[str, Any], tmp_path: Path) -> None:
    """A worker armed at `faults` dies there by SIGKILL."""
    killed = spawn_worker(
        "tests.support.apps.fanout:app", "--stop-when-idle", faults=faults, **common
    )
    assert killed.wait(timeout=40) == -signal.SIGKILL, (tmp_path / "workers.log").read_text()


def _recovered(app: keel.App, run: str, common: dict[str, Any], tmp_path: Path) -> list[str]:
    """A clean worker completes the run with every branch's output; returns the deliveries
    (each branch's effect, as the outside world received it), each exactly once."""
    clean = spawn_worker("tests.support.apps.fanout:app", "--stop-when-idle", **common)
    try:
        assert clean.wait(timeout=40) == 0, (tmp_path / "workers.log").read_text()
    except subprocess.TimeoutExpired:
        clean.kill()
        raise
    details = app.get_run(run)
    assert details.status == "completed", (details.run["error"], details.timeline)
    assert sorted(details.output["out"]) == list(range(BRANCHES))
    lines = Path(common["env"]["FANOUT_DELIVERIES"]).read_text().split()
    assert len(lines) == BRANCHES and len(set(lines)) == BRANCHES, lines
    return lines


def test_killed_between_a_parallel_task_and_its_steps_checkpoint_sends_each_effect_once(
    make_app: AppFactory, db_url: str, tmp_path: Path
) -> None:
    app = make_app()
    app.workflow("fanout")(build)
    run = app.submit("fanout", job_id="crash-fan-1", input={"n": BRANCHES})["run_id"]
    deliveries = tmp_path / "deliveries.txt"
    common = _common(db_url, tmp_path, deliveries)
    _killed_at(KILL_AT, common, tmp_path)

    # The step's checkpoint never committed: the run's last checkpoint is the one before it.
    saver = app.aio.runtime.portal.call(_opened(app))
    last = app.aio.runtime.portal.call(saver.aget_tuple({"configurable": {"thread_id": run}}))
    assert last is not None and last.metadata["step"] == 0, last and last.metadata
    assert last.pending_writes == [] or all(
        channel != "out" for _, channel, _ in last.pending_writes
    ), "a buffered task write committed without its checkpoint"
    before = deliveries.read_text().split() if deliveries.exists() else []
    assert len(before) == BRANCHES, "the kill came before every branch performed its effect"

    lines = _recovered(app, run, common, tmp_path)
    details = app.get_run(run)
    assert set(before) <= set(lines)
    assert [e["kind"] for e in details.timeline].count("lease.takeover") == 1


async def _opened(app: keel.App) -> Any:
    await app.aio.open()
    return app.aio.runtime.fencing()


def test_killed_before_a_first_execution_commits_resumes_from_the_admitted_input(
    make_app: AppFactory, db_url: str, tmp_path: Path
) -> None:
    """The input's checkpoint, not yet durable when LangGraph's `aput` for it returned, is not
    missed: the run starts again from its admission record, and completes once."""
    app = make_app()
    app.workflow("fanout")(build)
    run = app.submit("fanout", job_id="crash-fan-first", input={"n": BRANCHES})["run_id"]
    deliveries = tmp_path / "deliveries.txt"
    common = _common(db_url, tmp_path, deliveries)
    _killed_at(FIRST_COMMIT, common, tmp_path)
    saver = app.aio.runtime.portal.call(_opened(app))
    assert (
        app.aio.runtime.portal.call(saver.aget_tuple({"configurable": {"thread_id": run}})) is None
    )
    assert not deliveries.exists() or deliveries.read_text().split() == []

    _recovered(app, run, common, tmp_path)
    details = app.get_run(run)
    kinds = [e["kind"] for e in details.timeline]
    assert kinds.count("lease.takeover") == 1 and kinds.count("admitted") == 1
