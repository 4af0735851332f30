"""What `keel chaos` checks before its first cell, and how it reads a worker that gave up.

Every cell runs on a throwaway database that the harness hands its workers through
`$KEEL_DATABASE_URL`. An App whose URL is fixed in code (`keel.App("sqlite:///.keel/x.db")`)
ignores it: its workers would look for the user's own database, exit at once, and leave the
cell to time out. So the harness asks, once, where the App's database would be under a cell's
environment, in a fresh interpreter (the user's module may already be imported here, with
this process's environment), and refuses with one line that says how to write the App.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from keel.backends import redact

PROBE = "import sys; from keel.runtime.loading import load_app; print(load_app(sys.argv[1]).url)"


class HarnessError(Exception):
    """The harness itself cannot go on: a fact about the setup, not a finding about the
    workflow (reported in one line, without a traceback)."""


def check_app_follows_cell_database(spec: str, cwd: Path | None, root: Path) -> None:
    """HarnessError unless the App at `spec` takes its database from $KEEL_DATABASE_URL."""
    probe_url = f"sqlite:///{root / 'probe' / 'keel-chaos-probe.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env["KEEL_DATABASE_URL"] = probe_url
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, spec],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        raise HarnessError(f"importing {spec} took more than 120 s") from None
    if done.returncode != 0:
        raise HarnessError(f"cannot load {spec}: {last_line(done.stderr)}")
    url = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if url != probe_url:
        raise HarnessError(
            f"{spec} fixes its database in code ({redact(url)}), so the cells' workers "
            "cannot be given a throwaway database of their own: build it as keel.App() "
            "(it reads $KEEL_DATABASE_URL) or keel.App(os.environ.get('KEEL_DATABASE_URL', "
            "'<your url>'))"
        )


def last_line(text: str) -> str:
    """The last line of a process's output that says something: its error, as a rule."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def worker_gave_up(code: int, log: Path) -> HarnessError:
    """A cell's worker exited with an error before the run ended: say why, from its log."""
    try:
        said = last_line(log.read_text(errors="replace"))
    except OSError:
        said = "(its log cannot be read)"
    return HarnessError(f"a worker exited with status {code} before the run ended: {said} ({log})")
