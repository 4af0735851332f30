"""What Keel processes print: one readable line per run event by default, JSON lines that parse
and carry the ids, and never a secret (real `keel worker` and `keel serve` processes)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

import keel
from keel.core import leases, logs
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps import observed
from tests.support.apps.service import register
from tests.support.in_doubt import stalled_pay
from tests.support.providers import Provider
from tests.support.service_client import free_port
from tests.support.workers import claim, drain

SECRETS = (observed.DB_PASSWORD, observed.API_TOKEN, observed.SLACK_SECRET)
SECRET_ENV = {
    "KEEL_API_TOKENS": f"{observed.API_TOKEN}=*",
    "KEEL_SLACK_SIGNING_SECRET": observed.SLACK_SECRET,
}
APP = "tests.support.apps.observed:app"


def run_worker(db_url: str, tmp_path: Path, *args: str) -> str:
    out = tmp_path / "worker.log"
    proc = spawn_worker(
        APP,
        "--stop-when-idle",
        *args,
        database_url=db_url,
        env=SECRET_ENV,
        cwd=REPO,
        log=out,
        artifacts_dir=tmp_path / "artifacts",
    )
    assert proc.wait(timeout=60) == 0, out.read_text()
    return out.read_text()


def submit(db_url: str, job: str, **input: object) -> str:
    with keel.App(db_url) as app:
        app.workflow(observed.WORKFLOW)(observed.build)
        return str(app.submit(observed.WORKFLOW, job_id=job, input={"to": "a", **input})["run_id"])


def timeline(db_url: str, run_id: str) -> list[str]:
    with keel.App(db_url) as app:
        app.workflow(observed.WORKFLOW)(observed.build)
        return [e["kind"] for e in app.get_run(run_id).timeline]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_default_worker_prints_one_readable_line_per_run_event_and_no_secret(
    db_url: str, tmp_path: Path
) -> None:
    ok = submit(db_url, "ok")
    failed = submit(db_url, "bad", fail=True)
    text = run_worker(db_url, tmp_path)
    for secret in SECRETS:
        assert secret not in text
    assert "postgresql://keel:***@db.internal" in text  # the node's line, redacted
    assert "Traceback" in text  # the failed run's traceback is there, redacted too
    for run_id in (ok, failed):
        lines = [ln for ln in text.splitlines() if " keel.events " in ln and f"run={run_id}" in ln]
        # The committed events after admission (admission was in this test's process).
        kinds = [ln.split(" | ", 1)[1].split(" ", 1)[0] for ln in lines]
        assert kinds == timeline(db_url, run_id)[1:]
        assert all("worker=" in ln and "lease=1" in ln for ln in lines)
    node_line = next(ln for ln in text.splitlines() if "observed.nodes" in ln)
    assert (
        f"run={ok}" in node_line and "node=work" in node_line and "workflow=observed@1" in node_line
    )


@pytest.mark.parametrize("backend", ["sqlite"])
def test_json_lines_parse_and_carry_the_ids(db_url: str, tmp_path: Path) -> None:
    run_id = submit(db_url, "json")
    text = run_worker(db_url, tmp_path, "--log-format", "json")
    docs = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert len(docs) == len([ln for ln in text.splitlines() if ln.strip()]) - 1  # + the summary
    events = [d for d in docs if d.get("event") and d["logger"] == "keel.events"]
    assert [d["event"] for d in events] == timeline(db_url, run_id)[1:]
    for doc in events:
        assert doc["run_id"] == run_id and doc["job_id"] == "json"
        assert doc["workflow"] == "observed@1" and doc["worker_id"] and doc["token"] == 1
    steps = [d for d in events if d["event"] == "step" and d.get("node") == "work"]
    assert steps and "duration" in steps[0]
    node = next(d for d in docs if d["logger"] == "observed.nodes")
    assert (node["node"], node["step"], node["run_id"]) == ("work", 1, run_id)
    for secret in SECRETS:
        assert secret not in text


@pytest.mark.parametrize("backend", ["sqlite"])
def test_server_and_failing_worker_print_no_secret(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(SECRET_ENV, KEEL_DATABASE_URL=db_url, PYTHONUNBUFFERED="1")
    out = tmp_path / "serve.log"
    with open(out, "wb") as sink:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keel",
                "serve",
                APP,
                "--port",
                str(port),
                "--log-level",
                "debug",
            ],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
        auth = {"Authorization": f"Bearer {observed.API_TOKEN}"}
        assert httpx.get(f"{url}/v1/runs", headers=auth).status_code == 200
        httpx.get(f"{url}/v1/runs?token={observed.API_TOKEN}")
        httpx.get(f"{url}/v1/runs/{observed.API_TOKEN}", headers=auth)
        assert httpx.get(f"{url}/metrics").status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
    # A worker given a database URL with a wrong password says where it could not connect.
    bad = spawn_worker(
        APP,
        database_url=observed.SECRET_URL.replace("db.internal", "127.0.0.1"),
        env=SECRET_ENV,
        cwd=REPO,
        log=tmp_path / "bad.log",
    )
    assert bad.wait(timeout=60) != 0
    text = out.read_text() + (tmp_path / "bad.log").read_text()
    assert "GET /v1/runs" in text and "postgresql://keel:***@127.0.0.1" in text
    for secret in SECRETS:
        assert secret not in text


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_worker_serves_its_metrics_on_metrics_port(db_url: str, tmp_path: Path) -> None:
    run_id = submit(db_url, "metered")
    port = free_port()
    worker = spawn_worker(
        APP,
        "--metrics-port",
        str(port),
        database_url=db_url,
        cwd=REPO,
        log=tmp_path / "w.log",
        artifacts_dir=tmp_path / "artifacts",
    )
    try:
        deadline = time.monotonic() + 60
        text = ""
        while "keel_runs_finished_total{" not in text:
            assert worker.poll() is None and time.monotonic() < deadline, (
                tmp_path / "w.log"
            ).read_text()
            with contextlib.suppress(httpx.TransportError):
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            time.sleep(0.1)
    finally:
        worker.terminate()
        assert worker.wait(timeout=30) == 0
    assert 'keel_runs{status="completed",version="1",workflow="observed"} 1.0' in text
    assert (
        'keel_runs_finished_total{status="completed",version="1",workflow="observed"} 1.0' in text
    )
    assert 'keel_effects{effect="notify",state="sent"} 1.0' in text
    assert timeline(db_url, run_id)[-1] == "status.completed"


class Captured(logging.Handler):
    """Every record Keel logs in this process, as its handlers get it (ids copied on)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(logs.ContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured() -> Iterator[Captured]:
    handler = Captured()
    keel_logger = logging.getLogger("keel")
    level = keel_logger.level
    keel_logger.addHandler(handler)
    keel_logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        keel_logger.removeHandler(handler)
        keel_logger.setLevel(level)


def test_each_kind_of_run_event_logs_one_info_line_with_its_duration(
    make_app: Callable[..., keel.App], captured: Captured
) -> None:
    # Takeovers, an effect reconciled by lookup: a charge that stalled its worker past the lease.
    provider = Provider()
    app, paid = stalled_pay(make_app, provider, reconcile=True)
    assert app.get_run(paid).status == "completed"
    # A wait and its decision, a release by a stopping worker, status changes.
    register(app)
    reviewed = app.submit("review", job_id="logged-1", input={"topic": "t"})["run_id"]
    drain(app)
    app.approve(reviewed, by="editor")
    released = app.submit("review", job_id="logged-2", input={"topic": "u"})["run_id"]
    lease, _ = claim(app, "stopping-worker")
    assert lease.run_id == reviewed  # the decided run is the oldest claimable one
    app.aio.runtime.portal.call(leases.release(app.aio.runtime.store, lease, "worker stopping"))
    drain(app)
    assert app.get_run(reviewed).status == "completed"
    assert app.get_run(released).status == "waiting"

    records = [r for r in captured.records if getattr(r, "event", None)]
    by_kind: dict[str, list[logging.LogRecord]] = {}
    for record in records:
        by_kind.setdefault(record.event, []).append(record)  # type: ignore[attr-defined]
    wanted = {
        "lease.claimed": "claim",
        "run.resume": "resume",
        "lease.takeover": "takeover",
        "effect.reserve": "effect reserve",
        "effect.perform": "effect perform",
        "effect.sent": "effect record",
        "effect.reconcile": "effect reconcile",
        "wait.registered": "wait",
        "decision.recorded": "decision",
        "status.queued": "release (and a decision's requeue)",
        "status.waiting": "status change",
        "status.completed": "status change",
    }
    for kind, what in wanted.items():
        found = by_kind.get(kind)
        assert found, f"{what}: no {kind} line"
        for record in found:
            assert record.levelno == logging.INFO, (kind, record.levelname)
            assert isinstance(getattr(record, "duration", None), float), f"{kind}: no duration"
            assert record.run_id, kind  # type: ignore[attr-defined]
    # One line per event: each committed timeline event of these runs is logged once.
    for run_id in (paid, reviewed, released):
        timeline = [e["kind"] for e in app.get_run(run_id).timeline]
        logged = [r.event for r in records if r.name == "keel.events" and r.run_id == run_id]  # type: ignore[attr-defined]
        assert logged == timeline, run_id
    release = [r for r in by_kind["status.queued"] if "worker stopping" in r.getMessage()]
    assert len(release) == 1 and release[0].worker_id == "stopping-worker"  # type: ignore[attr-defined]
