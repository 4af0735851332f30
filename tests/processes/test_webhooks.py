"""Completion webhooks under real `keel worker` processes SIGKILLed around deliveries, to a
real receiver on 127.0.0.1 (allowed by configuration): every run's webhook arrives, signed; a
duplicate only ever repeats a delivery id with the same body; a receiver answering 503 with a
Retry-After for ten seconds only delays them. Each test counts what the receiver saw."""

from __future__ import annotations

import signal
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import keel
from keel.core.webhooks import new_secret
from keel.testing import spawn_worker
from tests.support.graphs import echo_graph
from tests.support.webhook_receiver import Receiver, receiving

pytestmark = pytest.mark.slow
APP = "tests.support.apps.webhooks:app"
SECRET = new_secret()
Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(SECRET) as r:
        yield r


@pytest.fixture
def app(db_url: str, tmp_path: Path) -> Iterator[keel.App]:
    with keel.App(
        db_url,
        artifacts_dir=tmp_path / "artifacts",
        webhook_secret=SECRET,
        webhook_allow_hosts="127.0.0.1",
    ) as made:
        made.workflow("echo")(echo_graph)
        yield made


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Spawn]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*, faults: str | None = None) -> subprocess.Popen[bytes]:
        proc = spawn_worker(
            APP,
            "--stop-when-idle",
            database_url=db_url,
            faults=faults,
            lease_ttl=1,
            # A killed dispatcher's delivery is sent again once its call's deadline has passed.
            effect_timeout=2.0,
            env={
                "KEEL_WEBHOOK_SECRET": SECRET,
                "KEEL_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
                "KEEL_LOG_LEVEL": "warning",
            },
            log=tmp_path / f"worker-{len(procs)}.log",
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def submit(app: keel.App, receiver: Receiver, n: int, tag: str) -> set[str]:
    """n runs with a webhook; the delivery ids their ends will be told under."""
    runs = [
        app.submit("echo", {"text": f"{tag}-{i}"}, job_id=f"{tag}-{i}", webhook=receiver.url)
        for i in range(n)
    ]
    return {f"webhook:{r.run_id}:0" for r in runs}


def assert_told_once_each(app: keel.App, receiver: Receiver, expected: set[str]) -> None:
    """Every expected delivery accepted, all signed, and a repeated id always the same body."""
    accepted = receiver.accepted()
    assert {d.id for d in accepted} == expected
    assert all(d.valid for d in receiver.all())
    bodies: dict[str, set[bytes]] = defaultdict(set)
    for delivery in receiver.all():
        bodies[delivery.id].add(delivery.body)
    assert set(bodies) == expected  # nothing was sent under any other id
    assert {len(b) for b in bodies.values()} == {1}, "a delivery id came with another body"
    intents = [i for i in app.effect_intents(limit=1000) if i["effect"] == "keel.webhook"]
    assert {i["intent_id"] for i in intents} == expected
    assert {i["status"] for i in intents} == {"delivered"}


def test_webhooks_survive_dispatchers_killed_around_their_deliveries(
    app: keel.App, receiver: Receiver, spawn: Spawn
) -> None:
    expected = submit(app, receiver, 12, "k")
    # Killed after a call the receiver answered, before it was recorded (sent again under its
    # id), then before a call, then right after a delivery was recorded.
    for fault in (
        "outbox.after_call:keel.webhook@2",
        "outbox.before_call:keel.webhook@3",
        "outbox.after_settle:keel.webhook@2",
    ):
        doomed = spawn(faults=fault)
        assert doomed.wait(timeout=90) == -signal.SIGKILL, fault
    clean = spawn()
    assert clean.wait(timeout=120) == 0
    assert_told_once_each(app, receiver, expected)
    per_id = defaultdict(int)
    for delivery in receiver.accepted():
        per_id[delivery.id] += 1
    assert max(per_id.values()) >= 2  # the kill after a call made a duplicate, same id


def test_a_receiver_answering_503_for_ten_seconds_only_delays(
    app: keel.App, receiver: Receiver, spawn: Spawn
) -> None:
    receiver.retry_after = "2"  # honoured: about five attempts each, well within the limit
    receiver.fail_for(10.0)
    expected = submit(app, receiver, 6, "slow")
    worker = spawn()
    assert worker.wait(timeout=120) == 0
    assert_told_once_each(app, receiver, expected)
    assert len(receiver.accepted()) == len(expected)  # no duplicate here: nothing was killed
    assert sum(d.status == 503 for d in receiver.all()) >= len(expected)
    attempts = [i["attempts"] for i in app.effect_intents(limit=1000)]
    assert max(attempts) > 1  # retried under the same id, never dead
