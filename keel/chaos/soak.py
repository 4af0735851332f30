"""Soak: many runs at once, workers SIGKILLed (and on PostgreSQL SIGSTOPped past their lease)
at random moments; every run must end as the clean run did, the world seeing each effect once
per run."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import keel
from keel.chaos.checks import Outcome, stale_writes

if TYPE_CHECKING:
    from keel.chaos.harness import Harness


def run_soak(harness: Harness, clean: Outcome, runs: int, seed: int = 7) -> list[str]:
    config = harness.config
    rng = random.Random(seed)
    problems: list[str] = []
    with harness.world() as (number, world), harness.database(number) as url:
        app = harness.app_on(url)
        try:
            app.migrate()
            ids = [
                app.submit(config.workflow, job_id=f"soak-{i}", input=config.input)["run_id"]
                for i in range(runs)
            ]

            def start() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    [sys.executable, "-m", "keel", "worker", config.app, "--concurrency", "4"],
                    cwd=config.cwd,
                    env=harness.env(url, app, world),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )

            workers = [start(), start()]
            deadline = time.monotonic() + config.cell_timeout + runs
            try:
                while time.monotonic() < deadline:
                    states = {r: app.get_run(r) for r in ids}
                    if all(keel.Status(d.status).finished for d in states.values()):
                        break
                    for details in states.values():
                        if details.status == "waiting":
                            pending = [w for w in details.waits if w["status"] == "pending"]
                            harness.answer(app, url, world, pending)
                    time.sleep(rng.uniform(0.2, 1.0))
                    victim = rng.randrange(len(workers))
                    if config.backend == "postgres" and rng.random() < 0.3:
                        workers[victim].send_signal(signal.SIGSTOP)
                        time.sleep(config.lease_ttl * 1.5)
                        workers[victim].send_signal(signal.SIGCONT)
                    else:
                        workers[victim].kill()
                        workers[victim].wait()
                        workers[victim] = start()
                else:
                    problems.append(f"not every run finished within {deadline:.0f}s")
            finally:
                for proc in workers:
                    proc.kill()
                    proc.wait()
            for run_id in ids:
                details = app.get_run(run_id)
                got = (details.status, details.decision, details.termination_reason)
                want = (clean.status, clean.decision, clean.termination_reason)
                if got != want:
                    problems.append(f"{run_id}: {got}, clean run {want}")
                problems.extend(
                    f"{run_id}: stale write: {w}" for w in stale_writes(details.timeline)
                )
            seen = world.counts()
            for probe, count in clean.world.items():
                if seen.get(probe, 0) != count * runs:
                    problems.append(
                        f"{probe}: {seen.get(probe, 0)} for {runs} runs, expected {count * runs}"
                    )
        finally:
            app.close()
    return problems
