"""Case 5: how fast another worker picks up the runs of a worker killed with SIGKILL.

Per round: worker A (`python -m keel worker`, KEEL_LEASE_TTL small) claims M slow runs (each
step sleeps); once A holds them all and the standby worker B is up and idle, A gets SIGKILL.
Latency per run = its `lease.takeover` timeline event - the moment of the kill; "resumed" is its
first step written by B. Leases are renewed every TTL/3, so a takeover is expected between
2/3 TTL and TTL after the kill, plus B's idle poll (which backs off to 1 s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from typing import Any

from bench.case_drain import keel_workers
from bench.common import CaseResult, Databases, Settings, Summary, Table

STEP_SLEEP = 0.8


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"takeover case: timed out waiting for {what}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _round(
    settings: Settings, dbs: Databases, url: str, app: Any
) -> tuple[list[float], list[float]]:
    m = settings.takeover_runs
    env = {"KEEL_LEASE_TTL": str(settings.lease_ttl), "BENCH_STEP_SLEEP": str(STEP_SLEEP)}
    prefix = f"takeover-{uuid.uuid4().hex[:8]}"
    (a,), _ = keel_workers(url, dbs, 1, concurrency=m, stop_when_idle=False, extra_env=env)
    b: subprocess.Popen[bytes] | None = None
    try:
        run_ids = [
            app.submit("chain5-slow", job_id=f"{prefix}-{i}", input={"n": 0})["run_id"]
            for i in range(m)
        ]

        def held_by_a() -> bool:
            runs = [app.get_run(r).run for r in run_ids]
            return all(r["status"] == "running" for r in runs)

        _wait(held_by_a, 60, "worker A to claim every run")
        workers_before = len(app.workers())
        (b,), _ = keel_workers(url, dbs, 1, concurrency=m, stop_when_idle=False, extra_env=env)
        _wait(lambda: len(app.workers()) > workers_before, 60, "worker B to start")
        time.sleep(0.3)  # B's first polls find nothing; now it is idle like a standby worker
        killed_at = time.time()
        os.kill(a.pid, signal.SIGKILL)
        a.wait()

        def all_done() -> bool:
            return all(app.get_run(r).status == "completed" for r in run_ids)

        _wait(all_done, 60 + 10 * settings.lease_ttl, "worker B to finish the runs")
        takeovers, resumes = [], []
        for run_id in run_ids:
            timeline = app.get_run(run_id).timeline
            taken = [e for e in timeline if e["kind"] == "lease.takeover" and e["at"] >= killed_at]
            if not taken:
                raise RuntimeError(f"run {run_id} finished without a lease.takeover event")
            owner = taken[0]["worker_id"]
            takeovers.append(float(taken[0]["at"]) - killed_at)
            steps = [
                e
                for e in timeline
                if e["kind"] == "step" and e["worker_id"] == owner and e["at"] >= killed_at
            ]
            if steps:
                resumes.append(float(steps[0]["at"]) - killed_at)
        return takeovers, resumes
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
        if b is not None:
            _stop(b)


def run(settings: Settings, dbs: Databases) -> CaseResult:
    ttl = settings.lease_ttl
    result = CaseResult(
        "takeover",
        "5. Takeover latency after SIGKILL",
        f"Worker A (`python -m keel worker`, `KEEL_LEASE_TTL={ttl:g}`) claims "
        f"{settings.takeover_runs} runs of a 5-step chain whose steps sleep {STEP_SLEEP} s; a "
        "standby worker B is started and left idle; A gets SIGKILL mid-run. Latency = the "
        "run's `lease.takeover` timeline event - the kill; resumed = its first step written "
        f"by B - the kill. {settings.takeover_rounds} round(s). Leases are renewed every "
        "TTL/3, so a lease runs out between 2/3 TTL and TTL after a kill; an idle worker "
        "polls at most every 1 s.",
    )
    rows = []
    for backend in settings.backends:
        url = dbs.keel(backend, "takeover")
        app = dbs.app(url)
        takeovers: list[float] = []
        resumes: list[float] = []
        try:
            for _ in range(settings.takeover_rounds):
                t, r = _round(settings, dbs, url, app)
                takeovers += t
                resumes += r
        finally:
            app.close()
        took = Summary.of(takeovers)
        resumed = Summary.of(resumes)
        rows.append(
            [
                backend,
                f"{ttl:g} s",
                str(took.n),
                took.fmt(2, " s"),
                resumed.fmt(2, " s"),
                f"{took.median - ttl:+.2f} s",
            ]
        )
        result.data[backend] = takeovers
        result.figures[f"{backend}.takeover_median"] = took.median
        result.figures[f"{backend}.takeover_over_ttl"] = took.median - ttl
    result.figures["ttl"] = ttl
    result.tables.append(
        Table(
            "Time from SIGKILL to takeover",
            ["backend", "lease TTL", "runs", "takeover", "resumed (first step)", "median - TTL"],
            rows,
        )
    )
    return result
