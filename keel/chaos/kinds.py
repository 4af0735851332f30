"""Fault kinds: what the world does to a run when its worker reaches the armed fault point.

Each kind is a column of the matrix (`keel chaos --fault kill,freeze,...`). `kill` SIGKILLs the
armed worker there. The others *hold* it there — it SIGSTOPs itself at the point
(`KEEL_FAULTS=point@n!stop`, see keel.core.faults) — do something to the world while it is held,
and SIGCONT it:

- `freeze`: another worker starts and the harness waits until the store shows it took the run
  over (a higher lease token); then the frozen one (a zombie) continues.
- `db-restart`: the PostgreSQL server restarts (a throwaway cluster, or the one
  --restart-cluster names).
- `db-error`: the worker's connections are dropped (PostgreSQL: `pg_terminate_backend` of its
  backends; SQLite: the next statement fails with an injected OperationalError).
- `clock-skew`: a second worker whose wall clock is ahead by more than the lease TTL starts next
  to the first.

The checks are the same for every kind (keel.chaos.checks): the run ends as the clean run did,
the outside world saw the same, nothing was written under a stale token.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import keel
from keel.core.clock import OFFSET_ENV
from keel.core.errors import UsageError
from keel.testing import pgcluster
from keel.testing.pgcluster import ThrowawayCluster


class ChaosConfig(Protocol):
    """What a kind reads of keel.chaos.harness.ChaosConfig."""

    backend: str
    postgres_url: str | None
    restart_cluster: str | None
    lease_ttl: float
    faults: tuple[str, ...]


class Harness(Protocol):
    """What a kind uses of keel.chaos.harness.Harness: starting processes."""

    def worker_args(self) -> list[str]: ...

    def spawn(self, args: list[str], env: dict[str, str], log: str) -> subprocess.Popen[bytes]: ...


FREEZE_PATIENCE = 10.0
"""How long a freeze cell waits, beyond 5 lease TTLs, for another worker that is up to take
the run over."""
SKEW_TTL = 15.0
"""The lease TTL of a clock-skew cell: long enough that the held worker keeps its lease while
the skewed one starts, so only a wrong clock can make it look expired."""
SKEW_LINGER = 2.0
"""How long the held worker stays held once the skewed one is up (two of its claim polls)."""


@dataclass
class Armed:
    """One armed execution: the cell's run, its database, and the workers' environments."""

    app: keel.App
    url: str
    run_id: str
    cell: str
    """The cell's name, for errors."""
    env: dict[str, str]
    """The armed worker's environment (KEEL_FAULTS set)."""
    clean_env: dict[str, str]
    """A fresh worker's environment."""
    deadline: float
    """time.monotonic() by which the cell must be over."""
    log: str
    """The prefix of the cell's process logs (and of names that must be unique per cell)."""

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def token(self) -> int:
        return int(self.app.get_run(self.run_id).run["lease_token"] or 0)

    def status(self) -> str:
        return self.app.get_run(self.run_id).status


@dataclass
class Struck:
    reached: bool
    """The armed worker reached the point and the fault was applied."""
    holder_lost: bool = False
    """The worker lost the run it held to the fault: the timeline must show a takeover."""
    problems: list[str] = field(default_factory=list)
    """What the kind saw break while it held the worker."""


IN_WRITE_TRANSACTION = ("checkpoint.before_write",)
"""Points that used to be reached inside a write transaction, where on SQLite the held worker
had the database's one write lock and no other worker could act. Since the step transaction
(issue 12) `checkpoint.before_write` is reached just before it (and where a task's writes are
buffered), holding nothing; the freeze and clock-skew cells there stay off on SQLite until they
have been run and pass."""


class FaultKind:
    name = ""
    action = "stop"
    """What the armed worker does at its point (`KEEL_FAULTS=point@n!action`)."""
    exclusive = False
    """Its cells run alone, after the others (a restart reaches every database served)."""
    needs_other_worker = False
    """Another worker must act while this one is held (freeze, clock-skew)."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config

    def check(self, config: ChaosConfig) -> None:
        """Refuse, with a clear error, a configuration this kind cannot run on."""

    def applies(self, point: str) -> bool:
        # The deciding process holds no lease and has no run to freeze or to lose.
        if point == "decision.after_record":
            return False
        sqlite = self.config.backend == "sqlite"
        return not (self.needs_other_worker and sqlite and point in IN_WRITE_TRANSACTION)

    def server(self) -> str | None:
        """The PostgreSQL server URL where this kind's cells get their database (None: the
        configured one)."""
        return None

    def close(self) -> None:
        """Give back what the kind set up (a throwaway cluster)."""

    def worker_env(self, armed: Armed) -> dict[str, str]:
        return {}

    def hold(self, harness: Harness, armed: Armed, procs: list[subprocess.Popen[bytes]]) -> Struck:
        """Act on the world while the armed worker (procs[0]) is held at its point."""
        raise NotImplementedError

    def strike(self, harness: Harness, armed: Armed) -> Struck:
        env = {**armed.env, **self.worker_env(armed)}
        env["KEEL_FAULTS"] += f"!{self.action}"
        procs = [harness.spawn(harness.worker_args(), env, f"{armed.log}.armed")]
        try:
            if not _stopped(procs[0], armed.deadline):
                return Struck(reached=False)
            struck = self.hold(harness, armed, procs)
            procs[0].send_signal(signal.SIGCONT)
            for proc in procs:
                proc.wait(timeout=armed.left())
            return struck
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"the workers of {armed.cell} did not finish in time") from None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                    proc.wait()


class Kill(FaultKind):
    """SIGKILL at the point; the harness runs these cells itself (keel.chaos.harness)."""

    name = "kill"
    action = "kill"

    def applies(self, point: str) -> bool:
        return True


class Freeze(FaultKind):
    name = "freeze"
    needs_other_worker = True

    def hold(self, harness: Harness, armed: Armed, procs: list[subprocess.Popen[bytes]]) -> Struck:
        frozen_since = time.monotonic()
        frozen_token, running = armed.token(), armed.status() == "running"
        procs.append(harness.spawn(harness.worker_args(), armed.clean_env, f"{armed.log}.other"))
        other = procs[1]
        # The zombie case: it continues only once another worker owns the run. A point reached
        # outside any held run (nothing to take over) ends when the other worker goes idle.
        # Patience counts from when the other worker is up: starting one can be slow on a
        # loaded machine, and that is not the runtime's fault.
        _until(armed, lambda: armed.token() > frozen_token or _up(armed, other))
        patience = time.monotonic() + FREEZE_PATIENCE + 5 * self.config.lease_ttl
        _until(
            armed,
            lambda: (
                armed.token() > frozen_token
                or other.poll() is not None
                or time.monotonic() > patience
            ),
        )
        if running and armed.token() == frozen_token:
            return Struck(
                reached=True,
                problems=[
                    f"no worker took the run over in {time.monotonic() - frozen_since:.0f}s while "
                    f"its owner was frozen (lease TTL {self.config.lease_ttl:g}s)"
                ],
            )
        return Struck(reached=True, holder_lost=running)


class ClockSkew(FaultKind):
    name = "clock-skew"
    needs_other_worker = True

    def worker_env(self, armed: Armed) -> dict[str, str]:
        return {"KEEL_LEASE_TTL": f"{SKEW_TTL:g}"}

    def hold(self, harness: Harness, armed: Armed, procs: list[subprocess.Popen[bytes]]) -> Struck:
        held_since, held_token = time.monotonic(), armed.token()
        env = {**armed.clean_env, "KEEL_LEASE_TTL": f"{SKEW_TTL:g}"}
        ahead = 3 * SKEW_TTL
        # A host whose clock is ahead: the worker's own clock (KEEL_CLOCK_OFFSET, read by
        # SystemClock, the one clock Keel's worker reads). The database's is not moved: SQLite's
        # is this host's, shared by every process on it, and PostgreSQL's is the server's.
        env[OFFSET_ENV] = f"{ahead:g}"
        procs.append(harness.spawn(harness.worker_args(), env, f"{armed.log}.skewed"))
        _until(armed, lambda: _up(armed, procs[1]) or armed.token() > held_token)
        linger = time.monotonic() + SKEW_LINGER
        _until(armed, lambda: time.monotonic() > linger or armed.token() > held_token)
        taken_after = time.monotonic() - held_since
        # The held worker renewed its lease at most a heartbeat (TTL/3) before it was held: a
        # takeover sooner than 2/3 TTL after that took a live lease, judged by a wrong clock.
        if armed.token() > held_token and taken_after < SKEW_TTL * 2 / 3:
            return Struck(
                reached=True,
                holder_lost=True,
                problems=[
                    f"a worker whose clock is {ahead:g}s ahead took the run over "
                    f"{taken_after:.1f}s after its owner was last seen alive (lease TTL "
                    f"{SKEW_TTL:g}s): lease expiry was judged by a worker's clock"
                ],
            )
        return Struck(reached=True, holder_lost=armed.token() > held_token)


class DbRestart(FaultKind):
    name = "db-restart"
    exclusive = True

    def __init__(self, config: ChaosConfig) -> None:
        super().__init__(config)
        self.cluster: ThrowawayCluster | None = None

    def check(self, config: ChaosConfig) -> None:
        if config.backend != "postgres":
            raise UsageError("--fault db-restart needs --backend postgres")
        if config.restart_cluster is None:
            if (why := pgcluster.available()) is not None:
                raise UsageError(
                    f"--fault db-restart needs a PostgreSQL cluster it may restart: name one "
                    f"with --restart-cluster VERSION/NAME, or let it make one ({why})"
                )
        elif "/" not in config.restart_cluster:
            raise UsageError("--restart-cluster takes VERSION/NAME, e.g. 15/main")

    def _cluster(self) -> ThrowawayCluster:
        if self.cluster is None:
            if self.config.restart_cluster is not None:
                version, name = self.config.restart_cluster.split("/", 1)
                port = urlsplit(self.config.postgres_url or "").port or 5432
                self.cluster = ThrowawayCluster(name, port=port, version=version)
            else:
                cluster = ThrowawayCluster()
                cluster.create()
                self.cluster = cluster
        return self.cluster

    def server(self) -> str | None:
        if self.config.restart_cluster is not None:
            return None
        return self._cluster().url("postgres")

    def close(self) -> None:
        if self.cluster is not None:
            self._cluster().drop()  # a named cluster was not created here: drop() leaves it
            self.cluster = None

    def hold(self, harness: Harness, armed: Armed, procs: list[subprocess.Popen[bytes]]) -> Struck:
        self._cluster().restart(timeout=armed.left())
        return Struck(reached=True)


class DbError(FaultKind):
    name = "db-error"

    def __init__(self, config: ChaosConfig) -> None:
        super().__init__(config)
        # SQLite has no server to drop the connection: the connector fails the next statement.
        self.action = "fail-next-statement" if config.backend == "sqlite" else "stop"
        self.sqlite = config.backend == "sqlite"

    def worker_env(self, armed: Armed) -> dict[str, str]:
        # libpq names the worker's connections, so the harness can find its backends.
        return {"PGAPPNAME": f"keel-chaos-{os.getpid()}-{armed.log}"}

    def hold(self, harness: Harness, armed: Armed, procs: list[subprocess.Popen[bytes]]) -> Struck:
        if self.sqlite:
            return Struck(reached=True)
        import psycopg

        with psycopg.connect(armed.url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                (self.worker_env(armed)["PGAPPNAME"],),
            )
        return Struck(reached=True)


KINDS: dict[str, type[FaultKind]] = {
    k.name: k for k in (Kill, Freeze, DbRestart, ClockSkew, DbError)
}
NAMES = tuple(KINDS)


@contextmanager
def fault_kinds(config: ChaosConfig) -> Iterator[dict[str, FaultKind]]:
    """The configured kinds by name, checked, closed after the matrix."""
    kinds = make_kinds(config)
    try:
        yield kinds
    finally:
        for kind in kinds.values():
            kind.close()


def make_kinds(config: ChaosConfig) -> dict[str, FaultKind]:
    unknown = [f for f in config.faults if f not in NAMES]
    if unknown:
        raise UsageError(f"unknown fault kinds {unknown}; known: {', '.join(NAMES)}")
    made: dict[str, FaultKind] = {}
    for name in dict.fromkeys(config.faults):
        kind: FaultKind
        kind = KINDS[name](config)
        kind.check(config)
        made[name] = kind
    return made


def _stopped(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait until the armed worker stops itself at its point (True) or exits (False)."""
    while True:
        pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
        if pid == 0:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(proc.args, 0)
            time.sleep(0.02)
            continue
        if os.WIFSTOPPED(status):
            return True
        # Reaped here, so Popen cannot: keep its exit status for it.
        proc.returncode = os.waitstatus_to_exitcode(status)
        return False


def _up(armed: Armed, proc: subprocess.Popen[bytes]) -> bool:
    """The worker process has announced itself in the store (or already exited)."""
    return proc.poll() is not None or any(w["pid"] == proc.pid for w in armed.app.workers())


def _until(armed: Armed, done: Callable[[], bool]) -> None:
    while not done():
        if time.monotonic() > armed.deadline:
            raise TimeoutError(f"{armed.cell}: the worker was held past the cell timeout")
        time.sleep(0.1)
