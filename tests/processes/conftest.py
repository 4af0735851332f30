"""Real worker processes against a real database, and a real SMTP server counting emails.

- `chaos`: the crash tests' harness on the mailer app (tests/support/crash.py).
- `spawn`: `keel worker` processes of the fleet app (tests/support/apps/fleet.py), killed at
  the end of the test if still running; `sink` is the SMTP server they send to.
- `cluster`: a PostgreSQL cluster of the module's own (`ThrowawayCluster`), for tests that stop,
  restart or partition the server: the shared one is never touched.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import keel
from keel.testing import SmtpSink, pgcluster, spawn_worker
from keel.testing.pgcluster import ThrowawayCluster
from tests.support import REPO
from tests.support.apps import mailer
from tests.support.crash import Chaos

FLEET_APP = "tests.support.apps.fleet:app"
EFFECT_TIMEOUT = 2.0
"""The fleet's effect timeout: a killed worker's key waits this (and a 1 s margin) for its call."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThrowawayCluster]:
    why = pgcluster.available()
    if why:
        if os.environ.get("KEEL_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"a throwaway PostgreSQL cluster is required: {why}")
        pytest.skip(why)
    with ThrowawayCluster() as pg:
        yield pg


@pytest.fixture
def chaos(db_url: str, tmp_path: Path) -> Iterator[Chaos]:
    spool = tmp_path / "spool"
    app = mailer.register(keel.App(db_url, artifacts_dir=tmp_path / "artifacts"))
    with SmtpSink(spool=spool) as sink:
        harness = Chaos(app=app, db_url=db_url, sink=sink, spool=spool, tmp_path=tmp_path)
        try:
            yield harness
        finally:
            harness.stop_all()
            app.close()


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SmtpSink]:
    with SmtpSink(spool=tmp_path / "spool") as server:
        yield server


@pytest.fixture
def spawn(
    db_url: str, sink: SmtpSink, tmp_path: Path
) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `keel worker` processes of the fleet app; any still running at the end are killed.

    Their lease TTL is 1 s unless a test asks for another; stderr is piped (a test may read it)
    and carries warnings and errors only.
    """
    procs: list[subprocess.Popen[bytes]] = []
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)

    def start(
        *args: str, lease_ttl: float = 1.0, clock_offset: str | None = None
    ) -> subprocess.Popen[bytes]:
        proc = spawn_worker(
            FLEET_APP,
            *args,
            database_url=db_url,
            lease_ttl=lease_ttl,
            clock_offset=clock_offset,
            effect_timeout=EFFECT_TIMEOUT,
            artifacts_dir=tmp_path / "artifacts",
            env={
                "FLEET_SMTP_URL": sink.url,
                "FLEET_SPOOL": str(sink.spool),
                "FLEET_MARKERS": str(markers),
                # Warnings only: a worker's INFO line per event would fill the unread pipe and
                # block the worker on its next write.
                "KEEL_LOG_LEVEL": "warning",
            },
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()
