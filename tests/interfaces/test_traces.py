"""OpenTelemetry traces (keel[otel]) of runs driven through the HTTP service, collected by the
SDK's in-memory exporter: one trace per run, spans per attempt, step and effect."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from keel.langgraph.traces import trace_id
from tests.support import REPO
from tests.support.service_client import Service
from tests.support.traces import as_dict, collected
from tests.support.workers import drain


def test_a_run_is_one_trace_of_its_attempts_steps_and_effect_linked_to_its_request(
    svc: Service,
) -> None:
    spans = collected()
    app = svc.app
    created = svc.http.post(
        "/v1/runs", json={"workflow": "review", "job_id": "traced-1", "input": {"topic": "t"}}
    )
    run_id = created.json()["run_id"]
    drain(app)
    app.approve(run_id, by="editor")
    drain(app)
    assert app.get_run(run_id).status == "completed"
    got = [as_dict(s) for s in spans.get_finished_spans()]
    traceparent = app.get_run(run_id).run["traceparent"]
    tid = trace_id(traceparent)
    assert tid is not None
    mine = [s for s in got if s["trace_id"] == tid]
    names = Counter(s["name"] for s in mine)
    assert names == {
        "keel.run review": 1,
        "keel.attempt review": 2,  # the first claim, then the resume after the decision
        "keel.step prepare": 1,
        "keel.step review": 2,  # interrupted, then re-run with the decision
        "keel.step notify": 1,
        "keel.effect notify_requester": 1,
    }, names
    by_id = {s["span_id"]: s for s in mine}
    (root,) = [s for s in mine if s["name"] == "keel.run review"]
    assert root["parent_id"] is None and root["attributes"]["keel.traced_by"] == "submit"
    assert traceparent.split("-")[2] == root["span_id"]
    for span in (s for s in mine if s["name"].startswith(("keel.run", "keel.attempt"))):
        # The name and the version apart, as the metrics label them.
        assert span["attributes"]["keel.workflow"] == "review"
        assert span["attributes"]["keel.workflow_version"] == "1"
    for attempt in (s for s in mine if s["name"].startswith("keel.attempt")):
        assert attempt["parent_id"] == root["span_id"]
        assert attempt["attributes"]["keel.run_id"] == run_id
    for step in (s for s in mine if s["name"].startswith("keel.step")):
        assert by_id[step["parent_id"]]["name"] == "keel.attempt review"
    (effect,) = [s for s in mine if s["name"].startswith("keel.effect")]
    assert by_id[effect["parent_id"]]["name"] == "keel.step notify"
    (row,) = app.get_run(run_id).effects
    assert effect["attributes"]["keel.effect.key"] == row["idempotency_key"]
    assert effect["attributes"]["keel.effect.outcome"] == "performed"
    outcomes = sorted(
        s["attributes"]["keel.step.outcome"] for s in mine if "keel.step.outcome" in s["attributes"]
    )
    assert outcomes == ["ok", "ok", "ok", "waiting"]
    # The HTTP request that submitted the run is traced, in its own trace, linked from the run.
    (request,) = [s for s in got if s["name"] == "POST /v1/runs"]
    assert request["trace_id"] != tid and root["links"] == [request["trace_id"]]


NO_PROVIDER = """
import sys
if sys.argv[2] == "absent":
    sys.modules["opentelemetry"] = None  # the extra not installed: importing it fails
import keel
from keel.langgraph import traces
from tests.support.apps import observed
from tests.support.workers import drain

assert traces.active() is None
with keel.App(sys.argv[1], artifacts_dir=sys.argv[3]) as app:
    app.workflow(observed.WORKFLOW)(observed.build)
    app.migrate()
    run_id = app.submit(observed.WORKFLOW, job_id="untraced", input={"to": "a"})["run_id"]
    drain(app)
    details = app.get_run(run_id)
    assert details.status == "completed", details.status
    assert details.run["traceparent"] is None
print("untraced")
"""


@pytest.mark.parametrize("otel", ["absent", "unconfigured"])
def test_without_the_extra_or_a_provider_runs_are_untraced(tmp_path: Path, otel: str) -> None:
    # A fresh interpreter: this one's tracer provider is set for good by the tests above.
    done = subprocess.run(
        [sys.executable, "-c", NO_PROVIDER, f"sqlite:///{tmp_path}/k.db", otel, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "OTEL_"))},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "untraced"
