"""Real worker processes against a real database, and a real SMTP server counting emails.

- `chaos`: the crash tests' harness on the mailer app (tests/support/crash.py).
- `spawn`: `keel worker` processes of the fleet app (tests/support/apps/fleet.py), killed at
  the end of the test if still running; `sink` is the SMTP server they send to.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import keel
from keel.testing import SmtpSink, spawn_worker
from tests.support import REPO
from tests.support.apps import mailer
from tests.support.crash import Chaos

FLEET_APP = "tests.support.apps.fleet:app"


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

    Their lease TTL is 1 s unless a test asks for another; stderr is piped (a test may read it).
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
            artifacts_dir=tmp_path / "artifacts",
            env={
                "FLEET_SMTP_URL": sink.url,
                "FLEET_SPOOL": str(sink.spool),
                "FLEET_MARKERS": str(markers),
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
