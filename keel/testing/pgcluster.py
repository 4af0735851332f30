"""A PostgreSQL cluster of the test's own, for tests that kill, stop or restart the server.

Crash tests must never restart a shared server: `ThrowawayCluster` creates a new cluster with
Debian's `pg_createcluster` (its own data directory and port on 127.0.0.1), starts it, and drops
it when the test is done. It needs the `postgresql-common` tools and the right to run them
(root, or the postgres user), as CI has.

    with ThrowawayCluster() as pg:
        url = pg.create_database("keel")
        ...
        pg.kill()          # SIGKILL the postmaster, as an OOM killer or a crashed host would
        pg.start()         # crash recovery, then accepting connections again
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

PASSWORD = "keel"
ROLE = "keel"


def available() -> str | None:
    """Why a throwaway cluster cannot be made here, or None if it can."""
    if shutil.which("pg_createcluster") is None:
        return "pg_createcluster not found (Debian's postgresql-common)"
    if os.geteuid() != 0:
        return "pg_createcluster needs root"
    if not latest_version():
        return "no PostgreSQL server version installed under /usr/lib/postgresql"
    return None


def latest_version() -> str | None:
    root = Path("/usr/lib/postgresql")
    versions = sorted((p.name for p in root.iterdir() if p.name.isdigit()), key=int)
    return versions[-1] if versions else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThrowawayCluster:
    def __init__(
        self, name: str | None = None, *, port: int | None = None, version: str | None = None
    ) -> None:
        """A new cluster (`create()`, or `with`); given the `version`, `name` and `port` of an
        existing one, an object that restarts it and never drops it (`keel chaos
        --restart-cluster`)."""
        version = version or latest_version()
        if version is None:
            raise RuntimeError("no PostgreSQL server installed")
        self.version = version
        self.name = name or f"keel_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.port = port or _free_port()
        self.created = False

    # -- lifetime ----------------------------------------------------------------------------

    def create(self) -> None:
        self._run(
            "pg_createcluster",
            self.version,
            self.name,
            "--port",
            str(self.port),
            # A crash test kills processes, not the machine: the OS keeps what was written.
            "-o",
            "fsync=off",
            "-o",
            "max_connections=200",
        )
        self.created = True
        self.start()
        self._psql(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{PASSWORD}'")

    def drop(self) -> None:
        if not self.created:
            return
        subprocess.run(
            ["pg_dropcluster", "--stop", self.version, self.name],
            check=False,
            capture_output=True,
        )
        self.created = False

    def __enter__(self) -> ThrowawayCluster:
        try:
            self.create()
        except BaseException:
            self.drop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.drop()

    # -- faults ------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it accepts connections (after crash recovery)."""
        deadline = time.monotonic() + timeout
        while True:
            started = subprocess.run(
                ["pg_ctlcluster", self.version, self.name, "start"],
                capture_output=True,
                text=True,
            )
            if started.returncode == 0 or "already running" in started.stderr:
                break
            # Backends of a killed postmaster may still hold its shared memory for a moment.
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.name} did not start: {started.stderr}")
            time.sleep(0.2)
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster {self.name} does not accept connections")
            time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast` disconnects every client, as a restart or failover does)."""
        self._run("pg_ctlcluster", self.version, self.name, "stop", "-m", mode)

    def restart(self, timeout: float = 30.0) -> None:
        """Stop the server (`fast`: every client is disconnected) and start it again."""
        self.stop("fast")
        self.start(timeout)

    def kill(self) -> int:
        """SIGKILL the postmaster; its backends exit on their own. Returns the pid killed."""
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pid

    def ready(self) -> bool:
        probe = subprocess.run(
            ["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)], check=False
        )
        return probe.returncode == 0

    def postmaster_pid(self) -> int:
        pid_file = self.data_dir / "postmaster.pid"
        return int(pid_file.read_text().splitlines()[0])

    @property
    def data_dir(self) -> Path:
        return Path("/var/lib/postgresql") / self.version / self.name

    # -- databases ---------------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def create_database(self, database: str) -> str:
        self._psql(f'CREATE DATABASE "{database}" OWNER {ROLE}')
        return self.url(database)

    def _psql(self, sql: str) -> None:
        self._run(
            "su", "postgres", "-c", f'psql -q -p {self.port} -h /var/run/postgresql -c "{sql}"'
        )

    @staticmethod
    def _run(*argv: str) -> None:
        done = subprocess.run(list(argv), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
