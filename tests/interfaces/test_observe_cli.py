"""`keel runs watch` and `keel prune` on a real database (typer's CliRunner, in this process)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from typer.testing import CliRunner, Result

import keel
from keel.cli import cli
from tests.support.apps import observed
from tests.support.workers import drain

AppFactory = Callable[..., keel.App]


def invoke(*args: str) -> Result:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("KEEL_")}
    result = CliRunner().invoke(cli, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_runs_watch_prints_the_timeline_in_order_from_a_cursor(
    make_app: AppFactory, db_url: str
) -> None:
    app = make_app()
    app.workflow(observed.WORKFLOW)(observed.build)
    run_id = app.submit(observed.WORKFLOW, job_id="w-1", input={"to": "a"})["run_id"]
    drain(app)
    timeline = app.get_run(run_id).timeline
    shown = invoke("runs", "watch", run_id, "--db", db_url, "--json")
    assert shown.exit_code == 0, shown.output
    lines = [json.loads(line) for line in shown.output.splitlines()]
    assert [e["event_id"] for e in lines] == [e["event_id"] for e in timeline]
    cursor = timeline[2]["event_id"]
    later = invoke("runs", "watch", run_id, "--db", db_url, "--after", str(cursor))
    assert later.exit_code == 0
    assert [int(ln.split()[0]) for ln in later.output.splitlines()[:-1]] == [
        e["event_id"] for e in timeline[3:]
    ]
    assert later.output.splitlines()[-1] == f"run {run_id} is completed"
    missing = invoke("runs", "watch", "nope-0123456789abcdef", "--db", db_url)
    assert missing.exit_code == 1 and "no run" in missing.output


def test_prune_command_dry_run_then_prune_and_bad_ages(make_app: AppFactory, db_url: str) -> None:
    clock = keel.ManualClock()
    app = make_app(clock=clock)
    app.workflow(observed.WORKFLOW)(observed.build)
    run_id = app.submit(observed.WORKFLOW, job_id="p-1", input={"to": "a"})["run_id"]
    drain(app)
    # The command's own App reads the system clock: the ManualClock's runs are from 2027.
    dry = invoke("prune", "--older-than", "1s", "--db", db_url, "--dry-run")
    assert dry.exit_code == 0 and "dry run: 0 finished run(s)" in dry.output
    assert invoke("prune", "--older-than", "soon", "--db", db_url).exit_code == 2
    assert (
        invoke("prune", "--older-than", "1d", "--status", "running", "--db", db_url).exit_code == 2
    )
    clock.advance(3 * 86400)
    report = app.prune(older_than="2d", dry_run=True)
    assert report.run_ids == [run_id]
    done = app.prune(older_than="2d")
    assert done.runs == 1 and done.rows["events"] > 0 and done.rows["checkpoints"] > 0
    assert app.list_runs() == []
