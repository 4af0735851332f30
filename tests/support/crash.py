"""Worker subprocesses killed for real, and the checks every crash test makes afterwards.

A crash test drives `tests.support.apps.mailer` through real `python -m keel worker` processes:
one armed with KEEL_FAULTS dies by SIGKILL at its fault point, a clean one picks the run up
once the dead worker's lease expires (KEEL_LEASE_TTL=1), and the test then counts what the
outside world saw: the messages the SMTP sink accepted.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keel
from keel.runtime.runtime import RunDetails
from keel.testing import spawn_worker
from keel.testing.smtp import ReceivedMail, SmtpSink
from tests.support import REPO
from tests.support.apps.mailer import message_id_for

APP_SPEC = "tests.support.apps.mailer:app"
KILLED = -signal.SIGKILL
LEASE_TTL = 1.0
EFFECT_TIMEOUT = 2.0
"""The timeout of the crash apps' effects: a worker killed mid-call leaves its key for the next
owner to reconcile once that call's deadline (this and a 1 s margin) has passed."""
WORKER_TIMEOUT = 40.0


@dataclass
class Worker:
    """One worker (or helper) subprocess and the file its output goes to."""

    proc: subprocess.Popen[bytes]
    log: Path
    faults: str | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self, limit: int = 4000) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text[-limit:]

    def wait(self, timeout: float = WORKER_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"worker {self.pid} (faults={self.faults}) still running after {timeout}s:\n"
                + self.output()
            ) from None

    def owns(self, worker_id: str | None) -> bool:
        """Whether a timeline's worker id is this process's (`host-PID-hex`)."""
        return bool(worker_id) and re.search(rf"-{self.pid}-[0-9a-f]+$", str(worker_id)) is not None


@dataclass
class Chaos:
    app: keel.App
    db_url: str
    sink: SmtpSink
    spool: Path
    tmp_path: Path
    workers: list[Worker] = field(default_factory=list)

    # -- processes ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """What the mailer app reads from its environment (beside Keel's own settings)."""
        return {"MAILER_SMTP_URL": self.sink.url, "MAILER_SPOOL": str(self.spool)}

    def _log(self) -> Path:
        return self.tmp_path / f"proc-{len(self.workers) + 1}.log"

    def spawn(
        self, faults: str | None = None, *, stop_when_idle: bool = True, concurrency: int = 4
    ) -> Worker:
        args = ["--concurrency", str(concurrency)]
        if stop_when_idle:
            args.append("--stop-when-idle")
        log = self._log()
        proc = spawn_worker(
            APP_SPEC,
            *args,
            database_url=self.db_url,
            faults=faults,
            lease_ttl=LEASE_TTL,
            effect_timeout=EFFECT_TIMEOUT,
            artifacts_dir=self.tmp_path / "artifacts",
            env=self.env(),
            cwd=REPO,
            log=log,
        )
        worker = Worker(proc, log, faults)
        self.workers.append(worker)
        return worker

    def crash(self, faults: str, *, concurrency: int = 4) -> Worker:
        """A worker armed at `faults`: it must die by SIGKILL there."""
        worker = self.spawn(faults, concurrency=concurrency)
        rc = worker.wait()
        assert rc == KILLED, (
            f"the worker armed with {faults} exited with {rc}, not SIGKILL: the point was "
            f"not reached\n{worker.output()}"
        )
        return worker

    def drain(self) -> Worker:
        """A clean worker, until nothing is queued or running (it waits out dead leases)."""
        worker = self.spawn()
        rc = worker.wait()
        assert rc == 0, f"the clean worker exited with {rc}\n{worker.output()}"
        return worker

    def prepare(self) -> None:
        """Run what is queued up to its waits in this process: the setup before a crash.

        Saves a subprocess start where nothing is killed; every worker that dies or recovers
        a killed worker's run is a subprocess.
        """
        stats = self.app.run_worker(stop_when_idle=True, handle_signals=False)
        assert stats.claimed >= 1, stats

    def kill(self, worker: Worker) -> None:
        os.kill(worker.pid, signal.SIGKILL)
        rc = worker.wait()
        assert rc == KILLED, f"worker {worker.pid} exited with {rc}\n{worker.output()}"

    def python(self, code: str, faults: str | None = None) -> Worker:
        """Run a snippet in a fresh interpreter with a worker's environment (and `faults`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update(
            self.env(),
            KEEL_DATABASE_URL=self.db_url,
            KEEL_LEASE_TTL=f"{LEASE_TTL:g}",
            KEEL_ARTIFACTS_DIR=str(self.tmp_path / "artifacts"),
            PYTHONUNBUFFERED="1",
        )
        if faults:
            env["KEEL_FAULTS"] = faults
        log = self._log()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        worker = Worker(proc, log, faults)
        self.workers.append(worker)
        worker.wait()
        return worker

    def stop_all(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()

    # -- runs ---------------------------------------------------------------------------------

    def submit(self, workflow: str, ticket: str) -> str:
        row = self.app.submit(
            workflow,
            job_id=f"ticket-{ticket.lower()}",
            input={"ticket": ticket, "to": f"customer-{ticket.lower()}@example.com"},
        )
        return str(row["run_id"])

    def details(self, run_id: str) -> RunDetails:
        return self.app.get_run(run_id)

    def wait_for(self, run_id: str, status: str, timeout: float = WORKER_TIMEOUT) -> RunDetails:
        deadline = time.monotonic() + timeout
        while True:
            details = self.details(run_id)
            if details.status == status:
                return details
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} is not {status}:\n{self.report(run_id)}")
            time.sleep(0.05)

    def report(self, run_id: str) -> str:
        """What the run and the processes did, for assertion messages."""
        d = self.details(run_id)
        lines = [f"run {run_id}: {d.status} / {d.decision} / {d.termination_reason}"]
        lines += [
            f"  {e['kind']:<18} {e['worker_id'] or '-':<28} token={e['lease_token']} {e['data']}"
            for e in d.timeline
        ]
        lines += [f"  effect {e['idempotency_key']} {e['status']}" for e in d.effects]
        lines += [f"  wait {w['kind']} {w['status']} {w['decision']}" for w in d.waits]
        lines += [f"  mail {m.message_id.strip()} {m.subject}" for m in self.sink.messages]
        for w in self.workers:
            if w.proc.returncode not in (0, KILLED):
                lines.append(f"--- pid {w.pid} rc={w.proc.returncode}\n{w.output()}")
        return "\n".join(lines)

    # -- the outside world --------------------------------------------------------------------

    def mails_for(self, details: RunDetails) -> list[ReceivedMail]:
        """Messages the sink accepted whose Message-ID belongs to one of the run's effects."""
        ids = {message_id_for(e["idempotency_key"]) for e in details.effects}
        return [m for m in self.sink.messages if m.message_id.strip() in ids]


def message_ids(mails: Iterable[ReceivedMail]) -> list[str]:
    return [m.message_id.strip() for m in mails]


def assert_fenced(details: RunDetails, killed: Iterable[Worker], *, takeover: bool) -> None:
    """No event of a killed worker, or of any superseded lease token, after a takeover.

    `takeover`: whether a killed worker held the run's lease when it died, so a clean worker
    must have taken the run over from it.
    """
    timeline = details.timeline
    killed = list(killed)
    dead_owners = {e["worker_id"] for e in timeline if any(w.owns(e["worker_id"]) for w in killed)}
    takeovers = [i for i, e in enumerate(timeline) if e["kind"] == "lease.takeover"]
    from_dead = [i for i in takeovers if timeline[i]["data"].get("previous_owner") in dead_owners]
    if takeover:
        assert from_dead, f"no lease.takeover from a killed worker {dead_owners}: {_kinds(details)}"
    for i in takeovers:
        event = timeline[i]
        new_token = int(event["lease_token"])
        previous = event["data"].get("previous_owner")
        stale = [
            e
            for e in timeline[i + 1 :]
            if (e["lease_token"] is not None and int(e["lease_token"]) < new_token)
            or (previous is not None and e["worker_id"] == previous)
        ]
        assert not stale, f"written after the takeover by a superseded lease: {stale}"
    tokens = [int(e["lease_token"]) for e in timeline if e["lease_token"] is not None]
    assert tokens == sorted(tokens), f"lease tokens went back in time: {_kinds(details)}"


def _kinds(details: RunDetails) -> list[tuple[str, Any, Any]]:
    return [(e["kind"], e["worker_id"], e["lease_token"]) for e in details.timeline]
