"""Infrastructure faults are not run failures: PostgreSQL's postmaster SIGKILLed or stopped for
40 s, SQLite's disk filled up, under real `keel worker` processes. Every run completes, every
email reaches the SMTP sink once, and no worker process exits on its own.

PostgreSQL tests use a cluster of their own (`ThrowawayCluster`): the shared server is never
stopped. The SQLite test puts the database on a small tmpfs of its own and fills it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import keel
from keel.testing import SmtpSink, spawn_worker
from keel.testing.http import HttpSink
from keel.testing.pgcluster import ThrowawayCluster
from tests.support import REPO
from tests.support.apps import fleet, mailer, outbox
from tests.support.checks import wait_until
from tests.support.crash import Chaos

APP = "tests.support.apps.fleet:app"
STEPS = ["analyze", "work", "send", "close", "archive"]
EFFECT_TIMEOUT = 15.0
"""The emails' timeout: longer than the SMTP client's own 10 s (tests/support/apps/fleet.py)."""


def _up(cluster: ThrowawayCluster) -> None:
    # pg_ctlcluster says "already running" on stdout, which ThrowawayCluster.start misses.
    if not cluster.ready():
        cluster.start()


class Fleet:
    """Worker processes of the fleet app on one database, sending to one SMTP sink."""

    def __init__(self, url: str, sink: SmtpSink, tmp: Path) -> None:
        self.url, self.sink, self.tmp = url, sink, tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.app = keel.App(url, artifacts_dir=tmp / "artifacts")
        self.app.aio.runtime.adopt(fleet.app.aio.runtime.workflows)

    def submit(self, runs: int, work: float = 0.0) -> list[str]:
        return [
            self.app.submit(
                "ticket", job_id=f"t-{i}", input={"ticket": f"T{i}", "work": work}
            ).run_id
            for i in range(runs)
        ]

    def start(
        self,
        workers: int,
        *,
        lease_ttl: float = 2.0,
        env: dict[str, str] | None = None,
        preexec: object = None,
    ) -> None:
        for n in range(workers):
            self.procs.append(
                spawn_worker(
                    APP,
                    "--concurrency",
                    "4",
                    "--stop-when-idle",
                    database_url=self.url,
                    lease_ttl=lease_ttl,
                    # A call cut off by an outage makes its run's next owner in another process
                    # wait out that call's deadline: within the checks' bound, not a minute.
                    effect_timeout=EFFECT_TIMEOUT,
                    artifacts_dir=self.tmp / "artifacts",
                    env={
                        "FLEET_SMTP_URL": self.sink.url,
                        "FLEET_SPOOL": str(self.sink.spool),
                        **(env or {}),
                    },
                    cwd=REPO,
                    log=self.tmp / f"worker-{n}.log",
                )
            )

    def alive(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def wait_started(self, within: float = 60.0) -> None:
        """Until every worker started has announced itself: a worker still in its preflight
        when the database goes away exits ("cannot connect", the preflight's contract); a fast
        first worker can deliver a test's first threshold before a slow host starts the rest."""
        wait_until(
            lambda: len(self.app.workers()) >= len(self.procs), within, "every worker started"
        )

    def delivered(self) -> int:
        return len(self.sink.messages)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("worker-*.log"))
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        self.app.close()

    def check(self, ids: list[str], *, exits_within: float) -> None:
        """Every worker ends on its own (stop-when-idle) with 0; every run completed; every
        ticket's email received exactly once; every effect settled."""
        deadline = time.monotonic() + exits_within
        for proc in self.procs:
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"a worker did not finish:\n{self.logs()}") from None
            assert code == 0, f"worker exited {code}:\n{self.logs()}"
        unfinished = {}
        for run_id in ids:
            details = self.app.get_run(run_id)
            if details.status != "completed":
                unfinished[run_id] = (
                    details.status,
                    details.run["error"],
                    [(e["kind"], e["data"]) for e in details.timeline],
                    [(e["status"], e["attempts"]) for e in details.effects],
                )
        assert not unfinished, f"runs not completed: {unfinished}\n{self.logs()}"
        per_ticket = Counter(m.message["X-Ticket"] for m in self.sink.messages)
        assert per_ticket == Counter({f"T{i}": 1 for i in range(len(ids))}), self.logs()
        for run_id in ids:
            details = self.app.get_run(run_id)
            assert details.output["steps"] == STEPS
            assert [e["status"] for e in details.effects] in (["sent"], ["confirmed"])


@pytest.fixture
def pg_fleet(cluster: ThrowawayCluster, tmp_path: Path) -> Iterator[Fleet]:
    _up(cluster)  # a previous test may have left it stopped
    url = cluster.create_database(f"keel_{uuid.uuid4().hex[:8]}")
    with keel.App(url) as app:
        app.migrate()
    with SmtpSink(spool=tmp_path / "spool") as sink:
        crew = Fleet(url, sink, tmp_path)
        try:
            yield crew
        finally:
            _up(cluster)
            crew.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_postmaster_sigkilled_three_times_under_100_runs_loses_nothing_and_sends_once(
    pg_fleet: Fleet, cluster: ThrowawayCluster
) -> None:
    # Slow enough (12 slots, 0.3 s each: ~40 runs/s) that three kills land with work to do.
    ids = pg_fleet.submit(100, work=0.3)
    # Leases outlive the restart (a few seconds): an execution that waited for the pool through
    # it goes on under a lease that is still its own. (With a TTL shorter than the outage it
    # may go on after a takeover; the ledger's fenced reserve and the last lease check before
    # the provider call are what stop it then: see docs/workers.md.)
    pg_fleet.start(3, lease_ttl=10.0)
    pg_fleet.wait_started()
    delivered_at_kills: list[int] = []
    for _ in range(3):
        # A few more emails since the last restart: the workers came back and made progress.
        # (Absolute thresholds raced a fast fleet: it drained the batch between two polls.)
        target = (delivered_at_kills[-1] if delivered_at_kills else 0) + 5
        wait_until(lambda t=target: pg_fleet.delivered() >= t, 60, f"{target} emails")
        delivered = pg_fleet.delivered()
        if delivered >= len(ids):
            break  # the batch outran the restarts: later kills would prove nothing
        cluster.kill()  # the postmaster; its backends follow, every connection breaks
        delivered_at_kills.append(delivered)
        assert pg_fleet.alive() == [None, None, None], pg_fleet.logs()
        cluster.start()  # crash recovery, then connections again
    # At least two kills landed with work still to do (the first one always does, at 5 of 100).
    assert len(delivered_at_kills) >= 2, delivered_at_kills
    pg_fleet.check(ids, exits_within=60)


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_down_for_40_seconds_pauses_work_and_then_finishes_it(
    pg_fleet: Fleet, cluster: ThrowawayCluster
) -> None:
    ids = pg_fleet.submit(100, work=0.02)
    pg_fleet.start(3)
    pg_fleet.wait_started()
    wait_until(lambda: pg_fleet.delivered() >= 20, 60, "20 emails")
    cluster.stop("fast")  # clients are disconnected; new connections are refused
    down_at = time.monotonic()
    sent_while_down = pg_fleet.delivered()
    while time.monotonic() - down_at < 40:  # longer than the pool's 30 s checkout timeout
        time.sleep(1)
        assert pg_fleet.alive() == [None, None, None], pg_fleet.logs()
    # At most the sends already in flight when it went down reached the provider.
    assert pg_fleet.delivered() - sent_while_down <= 12
    cluster.start()
    pg_fleet.check(ids, exits_within=60)


@pytest.mark.postgres
def test_postgres_stopped_between_an_answer_and_its_record_the_worker_records_that_answer(
    cluster: ThrowawayCluster, tmp_path: Path
) -> None:
    """The provider answered; before the ledger recorded it, the server went down. When it is
    back, the worker (alone, so the run comes back to it) records the answer it heard: the key
    is `sent`, not reconciled after its deadline, and the email went out once."""
    _up(cluster)
    url = cluster.create_database(f"keel_{uuid.uuid4().hex[:8]}")
    app = mailer.register(keel.App(url, artifacts_dir=tmp_path / "artifacts"))
    app.migrate()
    with SmtpSink(spool=tmp_path / "spool") as sink:
        chaos = Chaos(app=app, db_url=url, sink=sink, spool=tmp_path / "spool", tmp_path=tmp_path)
        try:
            run_id = chaos.submit("mailer", "K-1")
            chaos.prepare()
            assert app.approve(run_id, by="alice").recorded
            worker = chaos.spawn("effect.after_perform:send_email!stop")
            wait_until(lambda: _stopped(worker.pid), 40, "the worker to reach its record")
            assert sink.count(subject="Re: ticket K-1") == 1  # the provider has it
            cluster.stop("fast")
            os.kill(worker.pid, signal.SIGCONT)  # its record meets a server that is down
            wait_until(lambda: "PoolTimeout" in worker.output(), 40, "the worker to miss it")
            cluster.start()
            assert worker.wait() == 0, worker.output()
            details = chaos.wait_for(run_id, "completed")
            report = chaos.report(run_id)
            kinds = [e["kind"] for e in details.timeline]
            assert "effect.awaiting_deadline" not in kinds, report
            assert [e["status"] for e in details.effects] == ["sent"], report
            assert len(chaos.mails_for(details)) == 1, report
            assert sink.count(subject="Re: ticket K-1") == 1, report
        finally:
            _up(cluster)
            chaos.stop_all()
            app.close()


@pytest.mark.postgres
def test_postgres_stopped_between_an_outbox_delivery_and_its_record_the_dispatcher_records_it(
    cluster: ThrowawayCluster, tmp_path: Path
) -> None:
    """A provider that cannot tell a retry (`send_blind`: no idempotency key, no lookup)
    answered; before the dispatcher recorded that, the server went down for longer than the
    intent's claim and its call's deadline. When it is back, the dispatcher records the delivery
    it made: `delivered`, not left in doubt for a person, and the provider received it once."""
    _up(cluster)
    url = cluster.create_database(f"keel_{uuid.uuid4().hex[:8]}")
    app = outbox.register(keel.App(url, artifacts_dir=tmp_path / "artifacts"))
    app.migrate()
    log = tmp_path / "worker.log"
    with HttpSink() as provider:
        run_id = app.submit(
            "outbox", job_id="o-1", input={"count": 1, "effect": "blind", "tag": "pg"}
        ).run_id
        worker = spawn_worker(
            "tests.support.apps.outbox:app",
            "--stop-when-idle",
            database_url=url,
            faults="outbox.after_call:send_blind!stop",
            lease_ttl=1,
            effect_timeout=1.0,
            env={"OUTBOX_URL": provider.url, "KEEL_LOG_LEVEL": "warning"},
            log=log,
        )
        try:
            wait_until(lambda: _stopped(worker.pid), 40, "the dispatcher to reach its record")
            assert len(provider.deliveries) == 1  # the provider has it
            cluster.stop("fast")
            os.kill(worker.pid, signal.SIGCONT)  # its record meets a server that is down
            wait_until(lambda: "database unavailable" in log.read_text(), 40, "the record to fail")
            time.sleep(3)  # past the claim (1 s) and the call's deadline: reclaimable, in doubt
            cluster.start()
            assert worker.wait(timeout=120) == 0, log.read_text()
            details = app.get_run(run_id)
            intents = [i["status"] for i in app.effect_intents(run_id=run_id)]
            assert intents == ["delivered"], log.read_text()
            assert details.status == "completed", [e["kind"] for e in details.timeline]
            assert len(provider.deliveries) == 1
        finally:
            _up(cluster)
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            app.close()


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP at its fault point): state T in /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB filesystem of the test's own (tmpfs), so filling it up harms nothing else."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)


def _fill(disk: Path) -> Path:
    """Fill the filesystem to its last byte; return the filler to delete."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 1):  # megabytes, then the last pages, then single bytes
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    assert shutil.disk_usage(disk).free < 64 * 1024
    return filler


@pytest.mark.slow
def test_sqlite_disk_full_then_freed_every_run_completes_and_sends_once(
    small_disk: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{small_disk}/keel.db"
    with keel.App(url) as app:
        app.migrate()
    with SmtpSink(spool=tmp_path / "spool") as sink:
        crew = Fleet(url, sink, tmp_path)
        try:
            # Half a second of work a run: a worker alone needs 5 s for the batch, so the second
            # one starts while there is work left (at 0.05 s, one worker drained all 40 before
            # the other had started on a loaded machine, and the test waited for it in vain).
            ids = crew.submit(40, work=0.5)
            crew.start(2)
            crew.wait_started()
            wait_until(lambda: crew.delivered() >= 8, 60, "8 emails")
            filler = _fill(small_disk)
            time.sleep(6)  # writes fail: checkpoints, claims, heartbeats, the release
            assert crew.alive() == [None, None], crew.logs()
            assert crew.delivered() < 40, "the disk must fill up mid-batch"
            assert "database or disk is full" in crew.logs()
            filler.unlink()
            crew.check(ids, exits_within=80)
        finally:
            crew.close()
