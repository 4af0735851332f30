"""One trace per run across a takeover by a second worker process (keel[otel]).

The first `keel worker` is SIGKILLed right after its second effect is recorded; a second one
takes the run over when the lease expires. Each process exports its spans as JSON lines to its
own file ($KEEL_TEST_SPANS, tests/support/traces.py); this process, which submits the run,
collects its own (the run's root) with the SDK's in-memory exporter.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

import keel
from keel.langgraph.traces import trace_id
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps import traced
from tests.support.traces import ENV, as_dict, collected, read

APP = "tests.support.apps.traced:app"


@pytest.mark.slow
def test_one_trace_per_run_across_a_takeover_by_a_second_worker_process(
    db_url: str, tmp_path: Path
) -> None:
    memory = collected()
    world = tmp_path / "world.jsonl"
    with keel.App(db_url) as app:
        app.workflow(traced.WORKFLOW)(traced.build)
        run_id = app.submit(traced.WORKFLOW, job_id="t-1", input={"to": "ada"})["run_id"]

    files = [tmp_path / "spans-1.jsonl", tmp_path / "spans-2.jsonl"]
    for n, (spans, faults) in enumerate(
        [(files[0], "effect.after_record:deliver@1"), (files[1], None)], start=1
    ):
        worker = spawn_worker(
            APP,
            "--stop-when-idle",
            database_url=db_url,
            faults=faults,
            lease_ttl=1,
            env={ENV: str(spans), "TRACED_WORLD": str(world), "KEEL_LOG_LEVEL": "warning"},
            cwd=REPO,
            log=tmp_path / f"worker-{n}.log",
            artifacts_dir=tmp_path / "artifacts",
        )
        status = worker.wait(timeout=60)
        log = (tmp_path / f"worker-{n}.log").read_text()
        assert status == (-signal.SIGKILL if faults else 0), log

    with keel.App(db_url) as app:
        app.workflow(traced.WORKFLOW)(traced.build)
        done = app.get_run(run_id)
    assert done.status == "completed"
    kinds = [e["kind"] for e in done.timeline]
    assert "lease.takeover" in kinds
    # The outside world saw each effect once, whatever the kill.
    seen = Counter(json.loads(line)["effect"] for line in world.read_text().splitlines())
    assert seen == {"book": 1, "deliver": 1}

    tid = trace_id(done.run["traceparent"])
    assert tid is not None
    first, second = read(files[0]), read(files[1])
    local = [as_dict(s) for s in memory.get_finished_spans() if as_dict(s)["trace_id"] == tid]
    assert first and second
    # Every span either process exported for this run is in the run's one trace.
    assert {s["trace_id"] for s in first + second} == {tid}
    (root,) = local
    assert root["name"] == "keel.run traced" and root["attributes"]["keel.run_id"] == run_id
    assert root["span_id"] == done.run["traceparent"].split("-")[2]

    # The killed worker: what it ended before the kill (its attempt never ended).
    assert Counter(s["name"] for s in first) == {"keel.step draft": 1, "keel.effect book": 1}
    (book,) = [s for s in first if s["name"] == "keel.effect book"]
    assert book["attributes"]["keel.effect.outcome"] == "performed"
    # The second worker: its attempt, a child of the run's root like the first one's was.
    names = Counter(s["name"] for s in second)
    assert names == {
        "keel.attempt traced": 1,
        "keel.step send": 1,
        "keel.effect deliver": 1,
        "keel.step finish": 1,
    }, names
    (attempt,) = [s for s in second if s["name"] == "keel.attempt traced"]
    assert attempt["parent_id"] == root["span_id"]
    assert attempt["attributes"]["keel.lease_token"] == 2
    (draft,) = [s for s in first if s["name"] == "keel.step draft"]
    assert draft["parent_id"] not in {s["span_id"] for s in second}  # the dead attempt's
    (deliver,) = [s for s in second if s["name"] == "keel.effect deliver"]
    assert deliver["attributes"]["keel.effect.outcome"] == "served from the ledger"
    keys = {e["name"]: e["idempotency_key"] for e in done.effects}
    assert deliver["attributes"]["keel.effect.key"] == keys["deliver"]
    assert book["attributes"]["keel.effect.key"] == keys["book"]
    steps = {s["span_id"]: s["name"] for s in second if s["name"].startswith("keel.step")}
    assert steps[deliver["parent_id"]] == "keel.step send"
