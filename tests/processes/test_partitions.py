"""Partitions and slow providers never make a provider call twice (issue 28).

Real `keel worker` processes, a PostgreSQL cluster of this module's own, a TCP proxy of ours
between one worker and the database, and an HTTP provider that commits each charge at the end of
a call slower than the lease and does not deduplicate: it counts every charge it committed, per
reference (Keel's key). What these tests count is what the provider committed.

- A partition that hangs the worker's database link while its calls are on the wire: the run's
  next owner takes over once the lease lapses, but neither reconciles nor resends a key before
  its call's deadline; by then the provider has the late commit and the reconciler finds it.
- The same with the worker frozen (SIGSTOP) instead, on SQLite.
- A "lease is live" answer held by the network past the lease's remainder: acted on, it would
  let the old owner pay after the new one did; it is refused, and the charge happens once.
- Outbox deliveries in flight at the partition: reconciled after their deadline, never resent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import keel
from keel.testing import spawn_worker
from keel.testing.http import HttpSink
from keel.testing.netproxy import NetProxy
from keel.testing.pgcluster import ThrowawayCluster
from tests.support import REPO
from tests.support.apps import partitioned
from tests.support.checks import wait_until

pytestmark = pytest.mark.slow
APP = "tests.support.apps.partitioned:app"
LEASE_TTL = 2.0
TIMEOUT = 8.0
"""The charge effects' timeout: longer than the provider's call, which is longer than a lease."""
PROVIDER_SECONDS = 4.0
HOLD_OFF_MARGIN = 1.0
"""Seconds a takeover must come before a call's deadline for its owner to still reach the effect
before that deadline (replaying the run's steps first) and so be required to hold off."""


@pytest.fixture
def provider() -> Iterator[HttpSink]:
    with HttpSink() as sink:
        sink.commit_after = PROVIDER_SECONDS
        yield sink


Spawn = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn(provider: HttpSink, tmp_path: Path) -> Iterator[Spawn]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        url: str,
        *,
        concurrency: int = 20,
        faults: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        proc = spawn_worker(
            APP,
            "--concurrency",
            str(concurrency),
            database_url=url,
            faults=faults,
            lease_ttl=LEASE_TTL,
            artifacts_dir=tmp_path / "artifacts",
            env={
                "PAYMENTS_URL": provider.url,
                "PARTITION_EFFECT_TIMEOUT": f"{TIMEOUT:g}",
                "KEEL_LOG_LEVEL": "warning",
                **(env or {}),
            },
            cwd=REPO,
            log=tmp_path / f"worker-{len(procs)}.log",
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10)


def _app(url: str) -> keel.App:
    app = keel.App(url)
    app.aio.runtime.adopt(partitioned.app.aio.runtime.workflows)
    app.migrate()
    return app


def _charges(provider: HttpSink) -> Counter[str]:
    """Committed charges per reference (the provider deduplicates nothing)."""
    return Counter(str(d.json()["reference"]) for d in provider.lookup("/charges"))


def _all_ended(app: keel.App, run_ids: list[str]) -> bool:
    return all(app.get_run(r).status in ("completed", "failed") for r in run_ids)


def _took_over_at(timeline: list[dict[str, object]]) -> float:
    """When (by the database's clock) the run's last owner claimed it."""
    claims = [e for e in timeline if e["kind"] in ("lease.claimed", "lease.takeover")]
    return float(str(claims[-1]["at"]))


def _database(cluster: ThrowawayCluster) -> str:
    return cluster.create_database(f"p_{os.getpid()}_{time.monotonic_ns() % 10**9}")


@pytest.mark.postgres
@pytest.mark.parametrize("workflow", ["charge", "charge-async"])
def test_a_partition_mid_call_with_a_provider_slower_than_the_lease_charges_once(
    cluster: ThrowawayCluster, provider: HttpSink, spawn: Spawn, workflow: str
) -> None:
    url = _database(cluster)
    runs = 20
    with _app(url) as app, NetProxy("127.0.0.1", cluster.port) as proxy:
        cut_off = spawn(proxy.url_for(url))
        run_ids = [
            app.submit(workflow, job_id=f"{workflow}-{i}", input={"order": f"o-{i}"}).run_id
            for i in range(runs)
        ]
        wait_until(lambda: provider.arrived >= runs, 60, "every charge on the wire")
        hung_ns = time.monotonic_ns()
        proxy.hang()  # the worker's database link hangs, its calls still under way
        spawn(url)  # another worker, on a healthy path, takes the runs over
        wait_until(lambda: _all_ended(app, run_ids), 90, "every run ended")
        proxy.heal()  # the cut-off worker comes back: fenced out, it writes and sends nothing
        time.sleep(2 * LEASE_TTL)

        charges = _charges(provider)
        assert sum(charges.values()) == runs, charges
        assert set(charges.values()) == {1}, f"charged twice: {charges}"
        assert provider.arrived == runs
        # A charge that arrived a whole provider call before the cut may have been answered and
        # recorded on a healthy link (on a loaded machine the 20 calls spread out over more
        # than a provider call): `sent` or `confirmed`. One answered after the cut could only be
        # found by the reconciler.
        arrived = {str(d.json()["reference"]): d.received_ns for d in provider.lookup("/charges")}
        cut_mid_call = 0
        for run_id in run_ids:
            run = app.get_run(run_id)
            assert run.status == "completed", (run_id, run.status, run.error)
            [effect] = run.effects
            if arrived[effect["idempotency_key"]] > hung_ns - PROVIDER_SECONDS * 1e9:
                cut_mid_call += 1
                assert effect["status"] == "confirmed", (run_id, effect)
                kinds = [e["kind"] for e in run.timeline]
                # The new owner took the run over well before its call's deadline (both by the
                # database's clock): it must have held off rather than reconcile at once. One
                # that reached the run only past the deadline (a loaded machine) had nothing to
                # wait for.
                took_over = _took_over_at(run.timeline)
                if took_over < float(effect["deadline_at"]) - HOLD_OFF_MARGIN:
                    assert "effect.awaiting_deadline" in kinds, (run_id, took_over, effect, kinds)
            else:
                assert effect["status"] in ("sent", "confirmed"), (run_id, effect)
        assert cut_mid_call >= 1, "no call was cut mid-call: the test proved nothing"
        assert cut_off.poll() is None, "the cut-off worker exited"


def test_a_worker_frozen_mid_call_on_sqlite_is_not_charged_twice(
    provider: HttpSink, spawn: Spawn, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    runs = 5
    with _app(url) as app:
        frozen = spawn(url)
        run_ids = [
            app.submit("charge", job_id=f"c-{i}", input={"order": f"o-{i}"}).run_id
            for i in range(runs)
        ]
        wait_until(lambda: provider.arrived >= runs, 60, "every charge on the wire")
        frozen.send_signal(signal.SIGSTOP)
        spawn(url)
        wait_until(lambda: _all_ended(app, run_ids), 90, "every run ended")
        frozen.send_signal(signal.SIGCONT)
        time.sleep(2 * LEASE_TTL)
        charges = _charges(provider)
        assert sum(charges.values()) == runs and set(charges.values()) == {1}, charges
        assert {app.get_run(r).status for r in run_ids} == {"completed"}


@pytest.mark.postgres
def test_a_lease_is_live_answer_held_past_the_lease_is_not_acted_on(
    cluster: ThrowawayCluster, provider: HttpSink, spawn: Spawn
) -> None:
    """The worker pauses right before its charge (a GC pause: past the reservation's bound, so
    it must look at the lease again), and the network holds that look's answer longer than the
    lease: by the time "live" arrives, another worker owns the run. The old owner must not pay
    on it (and the new one must not pay before the old one's deadline)."""
    url = _database(cluster)
    provider.commit_after = 0.0
    with _app(url) as app, NetProxy("127.0.0.1", cluster.port) as proxy:
        # No round-trip bound on this worker (a deployment may set a long one): only the
        # liveness rule stands between a late "live" and a second charge.
        slow = spawn(
            proxy.url_for(url),
            concurrency=1,
            faults="effect.before_call:charge!stop",
            env={"KEEL_DB_ROUND_TRIP_TIMEOUT": "0"},
        )
        run_id = app.submit("charge", job_id="held", input={"order": "o-held"}).run_id
        wait_until(lambda: _stopped(slow), 60, "the worker paused before its charge")
        # Paused past the reservation's bound (half the lease it had left), not past the lease.
        time.sleep(0.6 * LEASE_TTL)
        proxy.hold_replies(3 * LEASE_TTL)  # every answer the worker waits for comes late
        slow.send_signal(signal.SIGCONT)
        spawn(url, concurrency=1)
        wait_until(lambda: _all_ended(app, [run_id]), 60, "the run ended")
        proxy.heal()
        time.sleep(3 * LEASE_TTL)  # whatever the old owner heard, it has acted on it by now
        charges = _charges(provider)
        assert list(charges.values()) == [1], f"charged {charges}"
        assert app.get_run(run_id).status == "completed"
        assert slow.poll() is None


def _stopped(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the process is stopped (SIGSTOP): state T in /proc."""
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


@pytest.mark.postgres
def test_outbox_deliveries_in_flight_at_a_partition_are_reconciled_not_resent(
    cluster: ThrowawayCluster, provider: HttpSink, spawn: Spawn
) -> None:
    url = _database(cluster)
    runs = 8
    with _app(url) as app, NetProxy("127.0.0.1", cluster.port) as proxy:
        spawn(proxy.url_for(url))
        for i in range(runs):
            app.submit("charge-outbox", job_id=f"ob-{i}", input={"order": f"o-{i}"})
        wait_until(lambda: provider.arrived >= runs, 60, "every delivery on the wire")
        proxy.hang()
        spawn(url)

        def delivered() -> bool:
            intents = app.effect_intents()
            return len(intents) == runs and {i["status"] for i in intents} == {"delivered"}

        wait_until(delivered, 90, "every intent delivered")
        proxy.heal()
        time.sleep(2 * LEASE_TTL)
        charges = _charges(provider)
        assert sum(charges.values()) == runs and set(charges.values()) == {1}, charges
