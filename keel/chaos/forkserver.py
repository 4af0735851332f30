"""Worker and decider processes forked from a process that has already imported Keel,
LangGraph and the user's app's dependencies: a cell's processes start in milliseconds instead
of the second or two a fresh interpreter takes to import them, which is most of a cell's time.

Each child is a real, separate process: it gets the cell's environment, re-imports the user's
own modules under it (an App reads KEEL_DATABASE_URL when it is built), re-reads its fault
points, runs `python -m MODULE ARGS` as usual (`keel worker ...`, `keel.chaos.decide ...`)
and dies by a real SIGKILL at its fault point. The server forks one child at a time and
reports its pid, then its exit status, on its stdout. Only on Linux; elsewhere, or with
`keel chaos --no-fork` (for a library that reads the cell's `--env` when it is imported), the
harness starts plain subprocesses.

Protocol (one JSON object per line): the server writes `{"ready": true}` once warm; for each
request `{"argv": ["keel", "worker", ...], "env": {...}, "log": PATH}` it writes `{"pid": N}`
and, when the child has exited, `{"status": S}` (negative: killed by signal -S). The child's
stdout and stderr go to the file at PATH (appended; without one, to /dev/null), and SIGUSR1
makes it write every thread's stack and every asyncio task's to that file: what the harness
does to a child that outlived its cell before it kills it, so a hang is diagnosed from the log.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import faulthandler
import gc
import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

SUPPORTED = sys.platform == "linux"

STACKS_GRACE = 2.0
"""Seconds a child that outlived its timeout has to write its stacks before it is killed."""


def _third_party(module: Any) -> bool:
    path = getattr(module, "__file__", None)
    if not path:
        return True  # built in, or a namespace package: nothing of the user's to re-run
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(str(Path(path).resolve()).startswith(str(Path(r).resolve())) for r in roots)


def serve(app: str) -> None:
    # The protocol keeps stdout to itself: whatever the user's modules print goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    # Warm what a worker imports (the `keel` command itself, a thin layer above, is not ours
    # to import: it loads in each child on top of these).
    import rich.console  # noqa: F401
    import typer  # noqa: F401

    import keel.backends.postgres
    import keel.backends.sqlite
    import keel.runtime.worker  # noqa: F401
    from keel.runtime.loading import load_app

    before = set(sys.modules)
    load_app(app)  # warms the user's dependencies; the user's own modules are re-run per child
    root = app.partition(":")[0].split(".")[0]
    # The user's own modules: those outside the interpreter's and site's folders, and the app's
    # own package wherever it is installed (its App reads the environment when it is built).
    users = sorted(
        n
        for n in set(sys.modules) - before
        if not _third_party(sys.modules[n]) or n == root or n.startswith(root + ".")
    )
    _say(out, {"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child never returns from here
            _child(out, request["argv"], request["env"], users, request.get("log"))
        _say(out, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _say(out, {"status": os.waitstatus_to_exitcode(status)})


def _say(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def _child(
    out: IO[str], argv: list[str], env: dict[str, str], users: list[str], log: str | None
) -> None:
    code = 1
    try:
        out.close()  # the server's protocol pipe is not the child's
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log else devnull
        for fd in (1, 2):
            os.dup2(output, fd)
        os.write(2, f"== pid {os.getpid()}: {' '.join(argv)}\n".encode())
        signal.signal(signal.SIGUSR1, _dump_stacks)
        os.environ.clear()
        os.environ.update(env)
        for name in users:
            sys.modules.pop(name, None)
        import keel.core.faults

        importlib.reload(keel.core.faults)  # arm and record from this child's environment
        sys.argv = list(argv)
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # as an interpreter says `sys.exit("why")`
        except BaseException:
            # What an interpreter does with an uncaught exception: its traceback, exit status 1
            # (it used to vanish here, and a cell's workers died silently one after another).
            traceback.print_exc()
    finally:
        # What a normal interpreter exit runs (the fault record among them), then out without
        # the parent's cleanups: they belong to the server.
        atexit._run_exitfuncs()
        sys.stdout.flush()
        os._exit(code)


def _dump_stacks(signum: int, frame: object) -> None:
    """Every thread's stack now, then every task of each running event loop, from that loop's
    own thread (a loop that never gets to it is itself the hang, and the threads show where)."""
    faulthandler.dump_traceback(all_threads=True)
    for loop in [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]:
        if loop.is_running():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_dump_tasks, loop)


def _dump_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    print(f"== {len(tasks)} asyncio task(s)", file=sys.stderr)
    for task in tasks:
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


class ForkServer:
    """The harness's end: `run(argv, env, timeout, log)` -> (exit status, pid)."""

    def __init__(self, app: str, cwd: Path, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "keel.chaos.forkserver", app],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._lock = threading.Lock()
        if self._read().get("ready") is not True:
            raise RuntimeError("the fork server did not start")

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server exited")
        return dict(json.loads(line))

    def run(
        self, argv: list[str], env: dict[str, str], timeout: float, log: Path | None = None
    ) -> tuple[int, int]:
        with self._lock:
            assert self._proc.stdin is not None
            request = {"argv": argv, "env": env, "log": str(log) if log else None}
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            pid = int(self._read()["pid"])
            expired = threading.Event()

            def expire() -> None:
                expired.set()
                if log is not None:  # its stacks into its log first (see the protocol)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)
                    time.sleep(STACKS_GRACE)
                _kill(pid)

            timer = threading.Timer(timeout, expire)
            timer.start()
            try:
                status = int(self._read()["status"])
            finally:
                timer.cancel()
            if expired.is_set():
                raise subprocess.TimeoutExpired(argv, timeout)
            return status, pid

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)


if __name__ == "__main__":
    serve(sys.argv[1])
