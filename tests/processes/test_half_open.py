"""A half-open database path does not stall a worker (promise 14): real `keel worker` processes
reach a throwaway PostgreSQL cluster through keel.testing.netproxy, which then drops the server
side of every connection and swallows whatever the workers send (a NAT, load balancer or pooler
that lost the flow: nothing is answered, nothing is closed, TCP itself never notices).

Each worker notices within its round-trip bound (a third of the lease TTL, at least 2 s), says
so in its log, and lets its leases go; once the path heals, or a worker on a good path arrives,
every run completes and every email reaches the SMTP sink once.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

import keel
from keel.testing import SmtpSink, spawn_worker
from keel.testing.netproxy import NetProxy
from keel.testing.pgcluster import ThrowawayCluster
from tests.support import REPO
from tests.support.apps import fleet
from tests.support.checks import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

APP = "tests.support.apps.fleet:app"
TTL = 3.0
RUNS = 10
TIMED_OUT = "got no answer from"
"""What a worker logs when a round trip times out (keel.backends.pg_bounds)."""


class Crew:
    """Fleet-app workers, some through the proxy, sending to one SMTP sink."""

    def __init__(self, url: str, proxy: NetProxy, sink: SmtpSink, tmp: Path) -> None:
        self.url, self.proxy, self.sink, self.tmp = url, proxy, sink, tmp
        self.markers = tmp / "markers"
        self.markers.mkdir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.app = keel.App(url, artifacts_dir=tmp / "artifacts")
        self.app.aio.runtime.adopt(fleet.app.aio.runtime.workflows)

    def start(self, *, proxied: bool) -> Path:
        log = self.tmp / f"worker-{len(self.procs)}.log"
        self.procs.append(
            spawn_worker(
                APP,
                "--concurrency",
                "4",
                "--stop-when-idle",
                database_url=self.proxy.url_for(self.url) if proxied else self.url,
                lease_ttl=TTL,
                artifacts_dir=self.tmp / "artifacts",
                env={
                    "FLEET_SMTP_URL": self.sink.url,
                    "FLEET_SPOOL": str(self.sink.spool),
                    "FLEET_MARKERS": str(self.markers),
                },
                cwd=REPO,
                log=log,
            )
        )
        return log

    def submit(self) -> list[str]:
        return [
            self.app.submit(
                "ticket", job_id=f"t-{i}", input={"ticket": f"T{i}", "work": 1.0}
            ).run_id
            for i in range(RUNS)
        ]

    def in_flight(self) -> int:
        return len(list(self.markers.glob("*.started")))

    def logs(self) -> str:
        """The workers' warnings and errors (their INFO lines are one per run event)."""
        out = []
        for path in sorted(self.tmp.glob("worker-*.log")):
            lines = [line for line in path.read_text().splitlines() if " INFO " not in line]
            out.append(f"--- {path.name}\n" + "\n".join(lines[-40:]))
        return "\n".join(out)

    def completed(self, ids: list[str]) -> bool:
        return all(self.app.get_run(run_id).status == "completed" for run_id in ids)

    def check_sent_once(self, ids: list[str]) -> None:
        for run_id in ids:
            details = self.app.get_run(run_id)
            assert details.status == "completed", (run_id, details.status, self.logs())
            assert [e["status"] for e in details.effects] in (["sent"], ["confirmed"])
        per_ticket = Counter(m.message["X-Ticket"] for m in self.sink.messages)
        assert per_ticket == Counter({f"T{i}": 1 for i in range(RUNS)}), self.logs()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        self.app.close()


@pytest.fixture
def crew(cluster: ThrowawayCluster, tmp_path: Path) -> Iterator[Crew]:
    url = cluster.create_database(f"keel_{uuid.uuid4().hex[:8]}")
    with keel.App(url) as app:
        app.migrate()
    server = urlsplit(url)
    assert server.hostname and server.port
    with (
        NetProxy(server.hostname, server.port) as proxy,
        SmtpSink(spool=tmp_path / "spool") as sink,
    ):
        made = Crew(url, proxy, sink, tmp_path)
        try:
            yield made
        finally:
            made.close()


def _stall(crew: Crew) -> tuple[list[str], list[Path], float]:
    """Two workers through the proxy, runs in flight, then the path goes half-open: each
    worker must say its round trip timed out within its bound (well inside two TTLs)."""
    ids = crew.submit()
    logs = [crew.start(proxied=True) for _ in range(2)]
    # Both started (a worker still in its preflight when the path dies exits: "cannot connect")
    wait_until(lambda: len(crew.app.workers()) >= 2, 60, "both workers started")
    wait_until(lambda: crew.in_flight() >= 4, 60, "runs in their slow step")
    assert not crew.completed(ids)
    crew.proxy.half_open()
    stalled_at = time.monotonic()
    for log in logs:
        wait_until(
            lambda log=log: TIMED_OUT in log.read_text(),
            2 * TTL + 1,
            lambda log=log: f"{log.name} to log a timed-out round trip:\n{crew.logs()}",
        )
    noticed = time.monotonic() - stalled_at
    assert [p.poll() for p in crew.procs] == [None, None], crew.logs()
    # Past a TTL: the stalled workers' leases have lapsed, their heartbeats having failed.
    time.sleep(max(0.0, TTL + 0.5 - noticed))
    for log in logs:
        text = log.read_text()
        assert "heartbeat: database unavailable" in text, text[-4000:]
        assert "within 2 s" in text, text[-4000:]  # the bound a 3 s TTL gives
    return ids, logs, noticed


def test_half_open_path_then_healed_every_run_completes_and_sends_once(crew: Crew) -> None:
    ids, _, noticed = _stall(crew)
    crew.proxy.heal()
    healed_at = time.monotonic()
    wait_until(
        lambda: crew.completed(ids), 3 * TTL + 6, lambda: f"every run completed:\n{crew.logs()}"
    )
    took = time.monotonic() - healed_at
    for proc in crew.procs:  # the stalled workers recovered: they finish and leave on their own
        assert proc.wait(timeout=30) == 0, crew.logs()
    crew.check_sent_once(ids)
    print(f"noticed after {noticed:.1f} s; every run completed {took:.1f} s after healing")


def test_half_open_path_a_worker_on_a_good_path_completes_every_run_once(crew: Crew) -> None:
    ids, _, noticed = _stall(crew)
    crew.start(proxied=False)
    fresh_at = time.monotonic()
    wait_until(
        lambda: crew.completed(ids), 3 * TTL + 6, lambda: f"every run completed:\n{crew.logs()}"
    )
    took = time.monotonic() - fresh_at
    assert [p.poll() for p in crew.procs[:2]] == [None, None], crew.logs()  # still alive
    crew.check_sent_once(ids)
    print(f"noticed after {noticed:.1f} s; every run completed {took:.1f} s after a fresh worker")
