"""Real `keel worker` processes for your own crash tests.

A crash test needs a worker that dies for real (SIGKILL, not an exception) at a chosen moment,
and a clean worker that picks the run up afterwards. `spawn_worker` starts one
`python -m keel worker APP` subprocess with the settings such a test varies: the database, the
fault point that kills it (KEEL_FAULTS, see docs/chaos.md), a short lease TTL so a dead
worker's run is taken over quickly, and where its artifacts and output go::

    import signal

    import keel
    from keel.testing import spawn_worker

    def test_the_reply_is_sent_once_when_the_worker_dies_after_sending(keel_db):
        app = myproject.register(keel.App(keel_db))  # keel_db: a migrated SQLite database
        run_id = app.submit("support-ticket", job_id="ticket-1", input={...})["run_id"]
        doomed = spawn_worker(
            "myproject.app:app", "--stop-when-idle",
            database_url=keel_db, faults="effect.after_perform:send_email", lease_ttl=1,
        )
        assert doomed.wait(timeout=60) == -signal.SIGKILL  # it died at the fault point
        clean = spawn_worker(
            "myproject.app:app", "--stop-when-idle", database_url=keel_db, lease_ttl=1
        )
        assert clean.wait(timeout=60) == 0  # it took the run over once the lease expired
        assert app.get_run(run_id).status == "completed"
        # ... and count what the outside world received (keel.testing.SmtpSink)
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import IO, Any

StrPath = str | os.PathLike[str]
Output = int | IO[Any] | None


def spawn_worker(
    app: str,
    *args: str,
    database_url: str | None = None,
    faults: str | None = None,
    lease_ttl: float | None = None,
    artifacts_dir: StrPath | None = None,
    clock_offset: float | str | None = None,
    effect_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: StrPath | None = None,
    log: StrPath | None = None,
    stdout: Output = None,
    stderr: Output = None,
) -> subprocess.Popen[bytes]:
    """Start `python -m keel worker APP *ARGS` in a subprocess and return it, running.

    `app` is the worker's MODULE:ATTRIBUTE (a `keel.App`), importable from `cwd` (default: the
    current directory). `args` are further options of `keel worker`, as on its command line:
    `"--stop-when-idle"` (exit once nothing is queued or running), `"--concurrency", "2"`.

    The environment is this process's, without any `KEEL_*` variable (a worker must not inherit
    the KEEL_FAULTS or KEEL_DATABASE_URL of the shell that runs the tests), plus `env`, plus the
    variables the keyword arguments set, which win over both:

    - `database_url`: KEEL_DATABASE_URL, the database the App reads when built without a URL;
    - `faults`: KEEL_FAULTS, e.g. `"effect.after_perform:send_email@2"`: the worker SIGKILLs
      itself at that fault point (its exit status is then `-signal.SIGKILL`);
    - `lease_ttl`: KEEL_LEASE_TTL in seconds; keep it short (1) when a clean worker has to take
      over the run of a killed one, since it waits for the dead worker's lease to expire;
    - `artifacts_dir`: KEEL_ARTIFACTS_DIR;
    - `clock_offset`: KEEL_CLOCK_OFFSET, seconds (or `"2h"`, `"-90s"`) the worker's own clock
      is off by, to show that leases and deadlines follow the database's clock; past 300 s the
      worker refuses to start unless `"--max-clock-skew", "0"` is among `args`;
    - `effect_timeout`: KEEL_EFFECT_TIMEOUT in seconds, the timeout of effects that declare
      none; keep it short when a worker is killed mid-call, since the run's next owner waits
      for that call's deadline before it reconciles the key.

    PYTHONUNBUFFERED is set, so the output of a worker killed mid-run is complete up to its
    death. That output goes to `log` if given (appended, stdout and stderr together), else to
    `stdout` and `stderr` as `subprocess.Popen` takes them (default: inherited; pass
    `subprocess.PIPE` to read it, or `subprocess.DEVNULL`). A worker logs a line per run event
    at INFO: read a pipe as it fills, or pass `env={"KEEL_LOG_LEVEL": "warning"}`.

    The caller owns the process: wait for it (`proc.wait(timeout=...)`), signal it
    (SIGTERM drains, SIGKILL crashes, SIGSTOP freezes) and kill it if the test ends first.
    """
    if log is not None and (stdout is not None or stderr is not None):
        raise ValueError("pass either `log` or `stdout`/`stderr`, not both")
    full = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    full.update(env or {})
    settings = {
        "KEEL_DATABASE_URL": database_url,
        "KEEL_FAULTS": faults,
        "KEEL_LEASE_TTL": None if lease_ttl is None else f"{lease_ttl:g}",
        "KEEL_ARTIFACTS_DIR": None if artifacts_dir is None else os.fspath(artifacts_dir),
        "KEEL_CLOCK_OFFSET": None if clock_offset is None else str(clock_offset),
        "KEEL_EFFECT_TIMEOUT": None if effect_timeout is None else f"{effect_timeout:g}",
    }
    full.update({name: value for name, value in settings.items() if value is not None})
    full.setdefault("PYTHONUNBUFFERED", "1")
    argv = [sys.executable, "-m", "keel", "worker", app, *args]
    if log is None:
        return subprocess.Popen(
            argv, cwd=cwd, env=full, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
        )
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            argv, cwd=cwd, env=full, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
