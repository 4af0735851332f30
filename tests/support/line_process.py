"""A helper process driven by JSON lines: `python -m MODULE ARGS` prints `ready` once it is
connected, then answers each JSON command on its stdin with one JSON line on its stdout.

The process tests' racers are such processes (tests.support.submitter, .thread_racer): started
before a race and connected, they are released at one instant by an `at` in their command.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Self

from tests.support import REPO


class LineProcess:
    """One such process on the Keel database `url`; its stderr goes to `log`."""

    def __init__(self, module: str, url: str, log: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update(KEEL_DATABASE_URL=url, KEEL_LOG_LEVEL="warning", PYTHONUNBUFFERED="1")
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.log = log
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode().strip())

    def _line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def ready(self) -> Self:
        line = self._line(60)
        assert line == "ready", f"{self.log.name} not ready ({line!r}): {self.output()}"
        return self

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float) -> dict[str, Any] | None:
        """Its answer to the next command, or None if none came within `timeout`."""
        line = self._line(timeout)
        return None if line is None else json.loads(line)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
