"""The crash matrix's parts: its configuration, its cells and the harness that runs one cell
(a throwaway database, the sinks that count the outside world, worker processes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keel
from keel.chaos.checks import Outcome, observe
from keel.runtime.loading import load_app
from keel.testing.http import HttpSink
from keel.testing.smtp import SmtpSink

KILLED = -9


@dataclass
class ChaosConfig:
    app: str
    """MODULE:ATTRIBUTE of the keel.App that registers the workflow."""
    workflow: str
    input: Any
    backend: str = "sqlite"
    postgres_url: str | None = None
    """A database on the server where each cell gets its own throwaway database."""
    decide: str = "approve"
    """How to answer approval waits: approve, reject or timeout (apply the deadline policy)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra worker environment; values may name {smtp_url}, {smtp_spool}, {http_url}."""
    points: tuple[str, ...] = ()
    """Only these fault points (default: every point the clean run reaches)."""
    max_occurrences: int | None = None
    """Cap the cells per (phase, point): the first, the last and evenly spaced ones between."""
    cell_timeout: float = 90.0
    lease_ttl: float = 1.0
    workdir: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)


@dataclass
class Cell:
    phase: int
    point: str
    occurrence: int
    verdict: str = "pending"
    """pass, fail, or not_reached (the armed process finished without reaching the point)."""
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return f"phase {self.phase} {self.point}@{self.occurrence}"


@dataclass
class Report:
    config: ChaosConfig
    clean: Outcome
    reached: list[dict[str, int]]
    cells: list[Cell]
    soak: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.verdict != "fail" for c in self.cells) and not self.soak


class Harness:
    """Databases, sinks and worker processes for one matrix."""

    def __init__(self, config: ChaosConfig, smtp: SmtpSink, http: HttpSink, root: Path) -> None:
        self.config = config
        self.smtp = smtp
        self.http = http
        self.root = root
        self.user_app = load_app(config.app)
        self.cells_made = 0

    # -- databases -----------------------------------------------------------------------------

    @contextmanager
    def database(self) -> Iterator[str]:
        self.cells_made += 1
        if self.config.backend == "sqlite":
            yield f"sqlite:///{self.root}/cell-{self.cells_made}.db"
            return
        import psycopg

        if not self.config.postgres_url:
            raise keel.core.errors.UsageError("--backend postgres needs --db postgresql://...")
        name = f"keel_chaos_{uuid.uuid4().hex[:12]}"
        base = self.config.postgres_url.rsplit("/", 1)[0]
        with psycopg.connect(self.config.postgres_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{base}/{name}"
        finally:
            with psycopg.connect(self.config.postgres_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def app_on(self, url: str) -> keel.App:
        """An App on the cell's database with the user's workflows (the user's module is
        imported once; its own App points at its own database)."""
        app = keel.App(url, artifacts_dir=self.root / "artifacts" / url.rsplit("/", 1)[-1])
        app.aio.adopt(self.user_app.aio.workflows)
        return app

    # -- processes -----------------------------------------------------------------------------

    def env(self, url: str, app: keel.App, **extra: str) -> dict[str, str]:
        values = {
            "smtp_url": self.smtp.url,
            "smtp_spool": str(self.smtp.spool),
            "http_url": self.http.url,
        }
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_FAULTS")}
        env.update({k: v.format(**values) for k, v in self.config.env.items()})
        env.update(
            KEEL_DATABASE_URL=url,
            KEEL_ARTIFACTS_DIR=str(app.aio.artifacts_root),
            KEEL_LEASE_TTL=str(self.config.lease_ttl),
            KEEL_CHAOS_SMTP_URL=self.smtp.url,
            KEEL_CHAOS_SMTP_SPOOL=str(self.smtp.spool),
            KEEL_CHAOS_HTTP_URL=self.http.url,
        )
        env.update(extra)
        return env

    def process(self, args: list[str], env: dict[str, str], timeout: float) -> int:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=self.config.cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise

    def world(self) -> dict[str, int]:
        return {
            "smtp messages": len(self.smtp.messages),
            "http deliveries": len(self.http.deliveries),
        }

    # -- one execution of the workflow -----------------------------------------------------------

    def execute(self, arm: Cell | None, record: Path | None = None) -> Outcome:
        """Run the workflow to its end on a fresh database, killing the armed process."""
        config = self.config
        before = self.world()
        with self.database() as url:
            app = self.app_on(url)
            try:
                app.migrate()
                run_id = app.submit(config.workflow, job_id="chaos", input=config.input)["run_id"]
                killed, killed_running = self._drive(app, url, run_id, before, arm, record)
                return observe(app, run_id, self._delta(before), killed, killed_running)
            finally:
                app.close()

    def _drive(
        self,
        app: keel.App,
        url: str,
        run_id: str,
        before: dict[str, int],
        arm: Cell | None,
        record: Path | None,
    ) -> tuple[bool, bool]:
        """Start workers and answer waits until the run finishes; return whether the armed
        process was killed, and whether the run was `running` when it died."""
        config = self.config
        deadline = time.monotonic() + config.cell_timeout
        phase, killed, killed_running = 0, False, False
        armed_left = arm is not None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not finish within {config.cell_timeout}s")
            details = app.get_run(run_id)
            if keel.Status(details.status).finished:
                return killed, killed_running
            pending = [w for w in details.waits if w["status"] == "pending"]
            if details.status == "waiting" and pending:
                at_decision = (
                    armed_left
                    and arm is not None
                    and arm.phase == phase
                    and arm.point == "decision.after_record"
                )
                died = self._answer(
                    app,
                    url,
                    pending,
                    before,
                    arm if at_decision else None,
                    f"{record}.d{phase}" if record is not None else None,
                )
                if at_decision:
                    armed_left, killed = False, died
                phase += 1
                if config.decide != "timeout" or any(w["kind"] != "approval" for w in pending):
                    continue
            arm_here = (
                armed_left
                and arm is not None
                and arm.phase == phase
                and arm.point != "decision.after_record"
            )
            extra = {}
            if arm_here and arm is not None:
                extra["KEEL_FAULTS"] = f"{arm.point}@{arm.occurrence}"
            if record is not None:
                extra["KEEL_FAULTS_RECORD"] = f"{record}.{phase}"
            code = self.process(
                ["keel", "worker", config.app, "--stop-when-idle"],
                self.env(url, app, **extra),
                max(1.0, deadline - time.monotonic()),
            )
            if arm_here:
                armed_left = False
                killed = code == KILLED
                killed_running = killed and app.get_run(run_id).status == "running"

    def _answer(
        self,
        app: keel.App,
        url: str,
        pending: list[dict[str, Any]],
        before: dict[str, int],
        arm: Cell | None,
        record: str | None,
    ) -> bool:
        """Answer the run's open waits as a person (or the deadline) would; return whether the
        armed decider process was killed."""
        died = False
        for wait in pending:
            if wait["kind"] == "effect":
                decision = "performed" if self._unaccounted(app, before) else ("not_performed")
            elif self.config.decide == "timeout":
                app.aio.portal.call(_expire_now(app, wait["wait_id"]))
                continue
            else:
                decision = "approved" if self.config.decide == "approve" else "rejected"
            extra = {}
            if arm is not None:
                extra["KEEL_FAULTS"] = f"{arm.point}@{arm.occurrence}"
            if record is not None:
                extra["KEEL_FAULTS_RECORD"] = record
            code = self.process(
                ["keel.chaos.decide", wait["run_id"], wait["wait_id"], decision],
                self.env(url, app, **extra),
                30,
            )
            died = died or code == KILLED
        return died

    def _unaccounted(self, app: keel.App, before: dict[str, int]) -> bool:
        """Did the outside world see a delivery the ledger does not account for? That is how a
        person would tell that the in-doubt effect happened."""
        delivered = sum(self._delta(before).values())
        recorded = 0
        for run in app.list_runs(limit=100_000):
            effects = app.get_run(run["run_id"]).effects
            recorded += sum(e["status"] in ("sent", "confirmed") for e in effects)
        return delivered > recorded

    def _delta(self, before: dict[str, int]) -> dict[str, int]:
        now = self.world()
        return {k: now[k] - before.get(k, 0) for k in now}


async def _expire_now(app: keel.App, wait_id: str) -> None:
    await app.aio.open()
    async with app.aio.store.transaction() as tx:
        await app.aio.store.expire_deadline_now(tx, wait_id)
