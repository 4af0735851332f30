"""The crash matrix's parts: its configuration, its cells and the harness that runs one cell
(a throwaway database, a fresh outside world of sinks, worker processes)."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keel
from keel.chaos.checks import Outcome, observe
from keel.chaos.decide import decide
from keel.chaos.forkserver import SUPPORTED, ForkServer
from keel.chaos.kinds import Armed, FaultKind, Kill
from keel.chaos.preflight import check_app_follows_cell_database, worker_gave_up
from keel.chaos.world import World
from keel.runtime.loading import load_app
from keel.testing.postgres import drop_database

KILLED = -9
log = logging.getLogger("keel.chaos")


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
    """Sample at most this many cells per (phase, point) (the first, the last, evenly between),
    plus every cell right after an outside delivery, which is never skipped."""
    jobs: int = 1
    """Cells run at once, each on its own database and outside world."""
    fork: bool = True
    """Fork workers from a warm server (keel.chaos.forkserver) where the platform can; False:
    a fresh interpreter for each process."""
    faults: tuple[str, ...] = ("kill",)
    """The fault kinds, one column of cells each (keel.chaos.kinds)."""
    restart_cluster: str | None = None
    """VERSION/NAME of the Debian cluster serving postgres_url that db-restart cells may
    restart; without it they run on a throwaway cluster of their own."""
    cell_timeout: float = 90.0
    lease_ttl: float = 1.0
    effect_timeout: float = 5.0
    """The timeout of the app's effects that declare none (the app's default is 60 s): a cell
    that kills a worker mid-call waits for that call's deadline before its key is reconciled."""
    workdir: Path | None = None
    cwd: Path = field(default_factory=Path.cwd)


@dataclass
class Cell:
    phase: int
    point: str
    occurrence: int
    kind: str = "kill"
    """The fault (keel.chaos.kinds): `kill` SIGKILLs the armed process at the point; `freeze`,
    `db-restart`, `db-error` and `clock-skew` hold it there while they strike."""
    verdict: str = "pending"
    """pass, fail, not_reached (the armed process finished without reaching the point), or
    skipped (not sampled)."""
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    where: str = ""
    """The code the fault interrupts, from the clean run's trace ("effect `charge` in node
    `pay`", "the checkpoint after node `send`")."""
    node: str = ""
    task_path: str = ""
    effect: str = ""
    after_deliveries: list[str] = field(default_factory=list)
    """The clean run's outside deliveries this cell comes right after (the risky cells)."""
    cause: str = ""
    """A failing cell's likely cause and fix."""
    world: dict[str, int] = field(default_factory=dict)
    """What the outside world counted in this cell (the clean run's is the report's)."""
    extra: list[str] = field(default_factory=list)
    """The deliveries the outside world saw beyond the clean run's."""

    @property
    def name(self) -> str:
        fault = "" if self.kind == "kill" else f"{self.kind} "
        return f"phase {self.phase} {fault}{self.point}@{self.occurrence}"


@dataclass
class Report:
    config: ChaosConfig
    clean: Outcome
    reached: list[dict[str, int]]
    cells: list[Cell]
    soak: list[str] = field(default_factory=list)
    seconds: float = 0.0
    skipped: list[Cell] = field(default_factory=list)
    """Cells the sampling did not run."""
    matrix_seconds: float = 0.0
    """The cells' wall time (without the clean run and the soak)."""

    @property
    def ok(self) -> bool:
        return all(c.verdict != "fail" for c in self.cells) and not self.soak

    @property
    def risky(self) -> list[Cell]:
        return [c for c in self.cells if c.after_deliveries]

    @property
    def cells_per_minute(self) -> float:
        return 60 * len(self.cells) / self.matrix_seconds if self.matrix_seconds else 0.0


class Harness:
    """Databases, outside worlds and worker processes for one matrix; cells may run at once
    (each has its own database and world)."""

    def __init__(
        self, config: ChaosConfig, root: Path, kinds: dict[str, FaultKind] | None = None
    ) -> None:
        self.config = config
        self.root = root
        self.kinds = kinds or {"kill": Kill(config)}
        self.user_app = load_app(config.app)
        check_app_follows_cell_database(config.app, config.cwd, root)
        self._numbers = itertools.count(1)
        self._admin = threading.Lock()
        self._local = threading.local()
        self._servers: list[ForkServer] = []
        self.fork = SUPPORTED and config.fork

    def close(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()

    # -- databases -----------------------------------------------------------------------------

    @contextmanager
    def database(self, number: int, server: str | None = None) -> Iterator[str]:
        """A fresh database (on PostgreSQL: on `server`, default the configured one)."""
        if self.config.backend == "sqlite":
            yield f"sqlite:///{self.root}/cell-{number}.db"
            return
        import psycopg

        if not self.config.postgres_url:
            raise keel.core.errors.UsageError("--backend postgres needs --db postgresql://...")
        server = server or self.config.postgres_url
        name = f"keel_chaos_{uuid.uuid4().hex[:12]}"
        base = server.rsplit("/", 1)[0]
        # One CREATE/DROP DATABASE at a time: concurrent ones contend for the template.
        with self._admin, psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"{base}/{name}"
        finally:
            self._drop(server, name)

    def _drop(self, server: str, name: str) -> None:
        """Drop a cell's database (keel.testing.postgres.drop_database retries while a session
        not ours to end, an autovacuum worker, is still on it); one still there after that is
        left behind, named keel_chaos_*, rather than failing the cell."""
        import psycopg

        try:
            with self._admin:
                drop_database(server, name)
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ObjectInUse):
            log.warning("could not drop the cell database %s; drop it by hand", name)

    def app_on(self, url: str) -> keel.App:
        """An App on the cell's database with the user's workflows (the user's module is
        imported once; its own App points at its own database)."""
        app = keel.App(url, artifacts_dir=self.root / "artifacts" / url.rsplit("/", 1)[-1])
        app.aio.runtime.adopt(self.user_app.aio.runtime.workflows)
        return app

    @contextmanager
    def world(self) -> Iterator[tuple[int, World]]:
        """A fresh outside world, numbered like the database that goes with it."""
        number = next(self._numbers)
        with World(self.root / f"world-{number}") as world:
            yield number, world

    # -- processes -----------------------------------------------------------------------------

    def env(self, url: str, app: keel.App, world: World, **extra: str) -> dict[str, str]:
        values = world.placeholders()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_FAULTS")}
        env.update({k: v.format(**values) for k, v in self.config.env.items()})
        env.update(
            KEEL_DATABASE_URL=url,
            KEEL_ARTIFACTS_DIR=str(app.aio.runtime.artifacts_root),
            KEEL_LEASE_TTL=str(self.config.lease_ttl),
            KEEL_EFFECT_TIMEOUT=str(self.config.effect_timeout),
            KEEL_CHAOS_SMTP_URL=values["smtp_url"],
            KEEL_CHAOS_SMTP_SPOOL=values["smtp_spool"],
            KEEL_CHAOS_HTTP_URL=values["http_url"],
        )
        env.update(extra)
        return env

    def worker_args(self) -> list[str]:
        return ["keel", "worker", self.config.app, "--stop-when-idle"]

    def spawn(self, args: list[str], env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
        """`python -m ARGS`, running, as a child of this process (a fault kind signals it and
        waits for it to stop); its output goes to logs/LOG.log under the work dir."""
        with open(self.log_path(log), "ab") as out:  # the child keeps its own descriptor
            return subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=self.config.cwd,
                env={**env, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log_path(self, log: str) -> Path:
        """logs/LOG.log under the work dir: the output of a cell's processes."""
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        return logs / f"{log}.log"

    def process(
        self, args: list[str], env: dict[str, str], timeout: float, log: str
    ) -> tuple[int, int]:
        """Run `python -m ARGS` to its end; return its exit status and pid. The process is
        forked from this thread's warm fork server (keel.chaos.forkserver) where there is one.
        Its output is appended to logs/LOG.log; one that outlives `timeout` first writes its
        stacks there (forked ones), and the TimeoutError names that file."""
        path = self.log_path(log)
        try:
            server = self._server() if self.fork else None
            if server is not None:
                return server.run(args, env, timeout, path)
            with open(path, "ab") as out:  # the child keeps its own descriptor
                proc = subprocess.Popen(
                    [sys.executable, "-m", *args],
                    cwd=self.config.cwd,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:
                return proc.wait(timeout=timeout), proc.pid
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{' '.join(args[:2])} did not end within {timeout:.0f}s (its output: {path})"
            ) from None

    def _server(self) -> ForkServer | None:
        server: ForkServer | None = getattr(self._local, "server", None)
        if server is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
            try:
                server = ForkServer(self.config.app, self.config.cwd, env)
            except (RuntimeError, ValueError):
                self.fork = False  # plain subprocesses from now on: slower, the same cells
                return None
            self._local.server = server
            with self._admin:
                self._servers.append(server)
        return server

    # -- one execution of the workflow -----------------------------------------------------------

    def execute(self, arm: Cell | None, record: Path | None = None) -> Outcome:
        """Run the workflow to its end on a fresh database and world, killing the armed
        process."""
        config = self.config
        server = self.kinds[arm.kind].server() if arm is not None else None
        with self.world() as (number, world), self.database(number, server) as url:
            app = self.app_on(url)
            try:
                app.migrate()
                run_id = app.submit(config.workflow, job_id="chaos", input=config.input)["run_id"]
                drive = _Drive(self, app, url, world, run_id, arm, record, number)
                killed, killed_running = drive.run()
                outcome = observe(app, run_id, world, killed, killed_running)
                outcome.fault_problems = drive.fault_problems
                return outcome
            finally:
                app.close()

    def answer(
        self,
        app: keel.App,
        url: str,
        world: World,
        pending: list[dict[str, Any]],
        faults: str | None = None,
        record: str | None = None,
        log: str = "answers",
    ) -> bool:
        """Answer the run's open waits as a person (or the deadline) would; return whether the
        deciding process was killed. The decision is made in this process unless it must be
        counted (`record`) or killed (`faults`): then a decider process of its own makes it."""
        died = False
        for wait in pending:
            if wait["kind"] == "effect":
                decision = "performed" if unaccounted(app, world) else "not_performed"
            elif self.config.decide == "timeout":
                app.aio.runtime.portal.call(_expire_now(app, wait["wait_id"]))
                continue
            else:
                decision = "approved" if self.config.decide == "approve" else "rejected"
            if faults is None and record is None:
                decide(app, wait["run_id"], wait["wait_id"], decision)
                continue
            extra = {"KEEL_FAULTS": faults} if faults else {}
            if record is not None:
                extra["KEEL_FAULTS_RECORD"] = record
            code, _ = self.process(
                ["keel.chaos.decide", wait["run_id"], wait["wait_id"], decision],
                self.env(url, app, world, **extra),
                30,
                log,
            )
            died = died or code == KILLED
        return died


@dataclass
class _Drive:
    """Workers and answers until the run finishes, the armed process killed on the way."""

    harness: Harness
    app: keel.App
    url: str
    world: World
    run_id: str
    arm: Cell | None
    record: Path | None
    number: int = 0
    fault_problems: list[str] = field(default_factory=list)
    """What a holding fault kind saw break while it held the armed worker."""

    def run(self) -> tuple[bool, bool]:
        """Return whether the armed process was struck, and whether it lost the run it held
        (a takeover must show)."""
        config, app, arm = self.harness.config, self.app, self.arm
        deadline = time.monotonic() + config.cell_timeout
        phase, killed, killed_running = 0, False, False
        armed_left = arm is not None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run did not finish within {config.cell_timeout}s")
            details = app.get_run(self.run_id)
            for intent in details.intents:
                if intent["status"] == "in_doubt":  # answered as a person would, as below
                    performed = unaccounted(app, self.world)
                    app.resolve_intent(intent["intent_id"], performed=performed, by="keel chaos")
            sending = [
                i for i in details.intents if i["status"] in ("pending", "sending", "in_doubt")
            ]
            if keel.Status(details.status).finished and not sending:
                # Its outbox intents delivered too (a run need not await them).
                return killed, killed_running
            # An outbox wait is the dispatcher's to answer, not a person's.
            pending = [
                w for w in details.waits if w["status"] == "pending" and w["kind"] != "outbox"
            ]
            if details.status == "waiting" and pending:
                at_decision = (
                    armed_left
                    and arm is not None
                    and arm.phase == phase
                    and arm.point == "decision.after_record"
                )
                died = self.harness.answer(
                    app,
                    self.url,
                    self.world,
                    pending,
                    _spec(arm) if at_decision and arm is not None else None,
                    f"{self.record}.d{phase}" if self.record is not None else None,
                    self.log,
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
            if arm_here and arm is not None and arm.kind != "kill":
                armed_left = False
                killed, killed_running = self._strike(arm, deadline)
                continue
            extra = {}
            if arm_here and arm is not None:
                extra["KEEL_FAULTS"] = _spec(arm)
            if self.record is not None:
                extra["KEEL_FAULTS_RECORD"] = f"{self.record}.{phase}"
            code, pid = self.harness.process(
                ["keel", "worker", config.app, "--stop-when-idle"],
                self.harness.env(self.url, app, self.world, **extra),
                max(1.0, deadline - time.monotonic()),
                self.log,
            )
            if code not in (0, KILLED):
                raise worker_gave_up(code, self.harness.log_path(self.log))
            if arm_here:
                armed_left = False
                killed = code == KILLED
                killed_running = killed and app.get_run(self.run_id).status == "running"
                if killed_running:
                    self._end_lease_of(pid)

    @property
    def log(self) -> str:
        """The name of this execution's log (logs/cell-N.log), shared by its processes."""
        return f"cell-{self.number}"

    def _strike(self, arm: Cell, deadline: float) -> tuple[bool, bool]:
        harness, app = self.harness, self.app
        armed = Armed(
            app,
            self.url,
            self.run_id,
            arm.name,
            harness.env(self.url, app, self.world, KEEL_FAULTS=_spec(arm)),
            harness.env(self.url, app, self.world),
            deadline,
            self.log,
        )
        struck = harness.kinds[arm.kind].strike(harness, armed)
        self.fault_problems = struck.problems
        return struck.reached, struck.holder_lost

    def _end_lease_of(self, pid: int) -> None:
        """The armed worker was seen dead: end its lease now rather than wait out the TTL (the
        takeover is the same claim, with a new token and a `lease.takeover` event)."""
        run = self.app.get_run(self.run_id).run
        if str(run["lease_owner"] or "").startswith(f"{socket.gethostname()}-{pid}-"):
            self.app.end_dead_lease(self.run_id, int(run["lease_token"]))


def _spec(cell: Cell) -> str:
    return f"{cell.point}@{cell.occurrence}"


def unaccounted(app: keel.App, world: World) -> bool:
    """Did the outside world see a delivery the ledger does not account for? That is how a
    person would tell that the in-doubt effect happened."""
    delivered = sum(world.counts().values())
    recorded = 0
    for run in app.list_runs(limit=100_000):
        details = app.get_run(run["run_id"])
        recorded += sum(e["status"] in ("sent", "confirmed") for e in details.effects)
        recorded += sum(i["status"] == "delivered" for i in details.intents)
    return delivered > recorded


async def _expire_now(app: keel.App, wait_id: str) -> None:
    await app.aio.open()
    async with app.aio.runtime.store.transaction() as tx:
        await app.aio.runtime.store.expire_deadline_now(tx, wait_id)
