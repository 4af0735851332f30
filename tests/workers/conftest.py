"""Real worker processes against a real database, and a real SMTP server counting emails."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keel.testing import SmtpSink

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.workers.fleet_app:app"


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[SmtpSink]:
    with SmtpSink(spool=tmp_path / "spool") as server:
        yield server


@pytest.fixture
def worker_env(db_url: str, sink: SmtpSink, tmp_path: Path) -> dict[str, str]:
    (tmp_path / "markers").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        KEEL_DATABASE_URL=db_url,
        KEEL_ARTIFACTS_DIR=str(tmp_path / "artifacts"),
        KEEL_LEASE_TTL="1",
        FLEET_SMTP_URL=sink.url,
        FLEET_SPOOL=str(sink.spool),
        FLEET_MARKERS=str(tmp_path / "markers"),
        PYTHONPATH=str(ROOT),
    )
    return env


@pytest.fixture
def spawn(worker_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `keel worker` processes; any still running at the end are killed."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keel", "worker", APP, *args],
            cwd=ROOT,
            env={**worker_env, **env},
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


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def assert_single_owner(timeline: list[dict[str, Any]]) -> None:
    """No run was executed by two workers at once: once a newer lease token wrote, no older
    token writes again (events are in commit order of their ids)."""
    highest = 0
    for event in timeline:
        token = event["lease_token"]
        if token is None:
            continue
        assert token >= highest, f"token {token} wrote after token {highest}: {event}"
        highest = token
