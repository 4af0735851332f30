"""Real `keel worker` processes of tests/support/apps/threads.py and the HTTP provider their
effects post to, for the process tests of threads (tests/processes/test_threads.py and
test_resume_kill.py): a test module's fixtures are one `with` over `fleet_on` and `app_for`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.testing import spawn_worker
from keel.testing.http import HttpSink
from tests.support import REPO
from tests.support.apps import threads
from tests.support.crash import KILLED, LEASE_TTL, Worker

APP = "tests.support.apps.threads:app"


@dataclass
class Fleet:
    """`keel worker` processes of the threads app, each logging to a file of its own."""

    db_url: str
    sink: HttpSink
    tmp_path: Path
    markers: Path
    workers: list[Worker] = field(default_factory=list)

    def spawn(self, faults: str | None = None) -> Worker:
        log = self.tmp_path / f"worker-{len(self.workers) + 1}.log"
        proc = spawn_worker(
            APP,
            "--stop-when-idle",
            database_url=self.db_url,
            faults=faults,
            lease_ttl=LEASE_TTL,
            env={"THREADS_SINK_URL": self.sink.url, "THREADS_MARKERS": str(self.markers)},
            cwd=REPO,
            log=log,
        )
        worker = Worker(proc, log, faults)
        self.workers.append(worker)
        return worker

    def crash(self, faults: str) -> Worker:
        """A worker armed at `faults`: it must die there by SIGKILL."""
        worker = self.spawn(faults)
        rc = worker.wait()
        assert rc == KILLED, f"armed with {faults}, it exited {rc}: not reached\n{worker.output()}"
        return worker

    def drain(self) -> Worker:
        """A clean worker, until nothing is queued or running (it waits out dead leases)."""
        worker = self.spawn()
        rc = worker.wait()
        assert rc == 0, f"the clean worker exited with {rc}\n{worker.output()}"
        return worker

    def stop_all(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()


@contextmanager
def fleet_on(db_url: str, sink: HttpSink, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet on `db_url` whose effects reach `sink`; its workers are killed at the end."""
    markers = tmp_path / "markers"
    markers.mkdir()
    harness = Fleet(db_url, sink, tmp_path, markers)
    try:
        yield harness
    finally:
        harness.stop_all()


@contextmanager
def app_for(db_url: str, fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[keel.App]:
    """An App of the threads app's workflows, in this process."""
    # What this process's own worker (a test's setup) needs to reach the provider.
    monkeypatch.setenv("THREADS_SINK_URL", fleet.sink.url)
    monkeypatch.setenv("THREADS_MARKERS", str(fleet.markers))
    with threads.register(keel.App(db_url)) as the_app:
        yield the_app


def received(sink: HttpSink, route: str) -> list[dict[str, Any]]:
    """The JSON bodies of the provider's deliveries to `route`, in arrival order."""
    return [d.json() for d in sink.deliveries if d.route == route]


def report(app: keel.App, run_ids: list[str], fleet: Fleet, heading: str) -> str:
    """What the runs and the processes did, for assertion messages."""
    lines = [heading]
    for run_id in run_ids:
        d = app.get_run(run_id)
        lines.append(f"run {run_id}: {d.status} / {d.termination_reason}")
        lines += [f"  {e['kind']:<18} token={e['lease_token']} {e['data']}" for e in d.timeline]
        lines += [f"  effect {e['idempotency_key']} {e['status']}" for e in d.effects]
    lines += [f"  sink {d.route} {d.json()}" for d in fleet.sink.deliveries]
    for w in fleet.workers:
        if w.proc.returncode not in (0, KILLED):
            lines.append(f"--- pid {w.pid} rc={w.proc.returncode}\n{w.output()}")
    return "\n".join(lines)
