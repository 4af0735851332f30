"""keel.heartbeat() inside a long step: progress survives the worker's death, as in Temporal."""

from __future__ import annotations

import signal

import pytest

import keel
from tests.support.apps import fleet


@pytest.mark.slow
def test_retried_attempt_reads_the_last_heartbeat_and_continues_from_it(make_app, spawn) -> None:
    app = make_app()
    app.workflow("batch")(fleet.batch)
    run_id = app.submit("batch", job_id="batch", input={"items": 10})["run_id"]
    first = spawn("--stop-when-idle")
    assert first.wait(timeout=60) == -signal.SIGKILL
    assert app.get_run(run_id).run["heartbeat_details"] is not None
    second = spawn("--stop-when-idle")
    assert second.wait(timeout=60) == 0
    done = app.get_run(run_id)
    assert done.status == "completed"
    assert done.output["resumed_from"] == 6  # items 0..5 were done when the first attempt died
    assert done.output["processed"] == [6, 7, 8, 9]


def test_heartbeat_outside_a_run_is_a_clear_error() -> None:
    with pytest.raises(keel.NotInRun):
        keel.heartbeat({"x": 1})
    with pytest.raises(keel.NotInRun):
        keel.last_heartbeat()
