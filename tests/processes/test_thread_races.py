"""Twenty answers racing for one interrupt, from HTTP and the `keel` command, on both backends
(issue 31): the first answer wins, every other one is refused and told who won and with what.

A run of `ask` (tests/support/thread_graphs.py: a plain `interrupt()`, then "done") is driven
to its interrupt by a real `keel worker` process. A real `keel serve` process and five real
`keel threads resume` processes share its database. Fifteen HTTP clients (OS threads, an
httpx client and connection each) and the five commands are released together, each with a
value of its own. Starting an interpreter and importing Keel takes about a second of CPU, most
of this test's time (five commands, not fifteen: a race needs several per channel, and each
extra one costs about a second on two cores): the commands start with the first worker and
the server, and wait for a start file, so all twenty answers leave within about a tenth of a
second of each other. Then:

- exactly one answer is recorded: one HTTP 200 or one command exiting 0;
- every other HTTP answer is 409 `decision_conflict` carrying the winner's value and naming
  the winner; every other command exits 1 with one line on stderr naming the winner and its
  value, without a traceback;
- the wait holds the winner's value, and once a second worker process has finished the run the
  thread's state holds it too: the run completed once, with one `decision.recorded`.

The second worker starts after the race: an answer that arrives once the run has completed is
told that nothing waits (a refusal of its own, not this race's). Which channel wins depends on
the machine: the commands usually do on two busy cores, where the server answers fifteen
requests at once; the assertions hold whichever does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import keel
from keel.core.codec import loads
from keel.core.waits import resume_value
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.crash import WORKER_TIMEOUT
from tests.support.service_client import ADMIN, bearer, free_port
from tests.support.thread_graphs import register

pytestmark = pytest.mark.slow

API_PREFIXES = ("/v1", "")
"""Where Keel's own HTTP API may live, tried in this order: under /v1, or at the root (before
it moved). The server's OpenAPI document says which one serves the resume endpoint."""
RESUME = "/threads/{thread_id}/resume"
APP = "tests.support.thread_graphs:fresh_app"
THREAD = "race-1"
QUESTION = "which color?"
HTTP_RACERS = 15
CLI_RACERS = 5
START_TIMEOUT = 60.0

RACER = """
import os, sys, time
from pathlib import Path

import typer.main

from keel.cli import cli

ready, start, *argv = sys.argv[1:]
keel = typer.main.get_command(cli)
Path(ready).touch()
deadline = time.monotonic() + float(os.environ["RACE_START_TIMEOUT"])
while not os.path.exists(start):
    if time.monotonic() > deadline:
        sys.exit("the start file never appeared")
    time.sleep(0.002)
keel(args=argv, prog_name="keel")
"""
"""`keel ARGV` as `keel.cli.main()` runs it, in an interpreter that has imported Keel and built
the command's tree (typer takes a tenth of a second for it) before the start line: it says so
with its `ready` file, then waits for `start`. What runs after the start is the command."""


@dataclass
class Racer:
    """One answer: who gives it (`by`), through which channel, and its value."""

    by: str
    channel: str  # "http" or "cli": what the wait records as the winner's channel
    value: str
    recorded: bool = False
    status: int | None = None  # the HTTP status, or the command's exit code
    body: dict[str, Any] = field(default_factory=dict)  # HTTP
    stdout: str = ""  # CLI
    stderr: str = ""  # CLI

    def __str__(self) -> str:
        said = json.dumps(self.body) if self.channel == "http" else self.stdout + self.stderr
        return f"{self.by}: {self.status} {said.strip()}"


@dataclass
class Processes:
    """The test's subprocesses: killed if still running when it ends."""

    tmp_path: Path
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    def env(self, **settings: str) -> dict[str, str]:
        # No KEEL_* of the shell running the tests: only what the test sets.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        return {**env, "PYTHONUNBUFFERED": "1", **settings}

    def worker(self, db_url: str, name: str) -> subprocess.Popen[bytes]:
        """A `keel worker` that runs what is queued and exits once nothing is."""
        proc = spawn_worker(
            APP, "--stop-when-idle", database_url=db_url, cwd=REPO, log=self.log(name)
        )
        self.procs.append(proc)
        return proc

    def serve(self, db_url: str, attempt: int = 1) -> Server:
        """Start `keel serve` of the thread graphs; `Server.ready` waits until it answers."""
        port = free_port()
        env = self.env(KEEL_DATABASE_URL=db_url, KEEL_API_TOKENS=f"{ADMIN}=*")
        command = [sys.executable, "-m", "keel", "serve", APP, "--port", str(port)]
        log = self.log(f"serve-{attempt}")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*command, "--log-level", "warning"],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return Server(self, db_url, proc, f"http://127.0.0.1:{port}", log, attempt)

    def racer(self, ready: Path, start: Path, *argv: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", RACER, str(ready), str(start), *argv],
            cwd=REPO,
            env=self.env(RACE_START_TIMEOUT=f"{START_TIMEOUT:g}"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> Path:
        return self.tmp_path / f"{name}.log"

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    harness = Processes(tmp_path)
    try:
        yield harness
    finally:
        harness.stop_all()


def finished(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait for a worker that stops when idle; it must exit cleanly."""
    try:
        rc = proc.wait(WORKER_TIMEOUT)
    except subprocess.TimeoutExpired:
        rc = None
    assert rc == 0, f"the worker exited with {rc}:\n{log.read_text(errors='replace')[-4000:]}"


@dataclass
class Server:
    """A `keel serve` process on the test's database."""

    processes: Processes
    db_url: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    attempt: int

    def ready(self) -> tuple[str, str]:
        """Wait until the server answers; its URL, and the prefix its OpenAPI document gives
        the resume endpoint. A port another process took between `free_port` and the bind
        (tests run side by side) gets the server started again on another."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            for prefix in ("", *API_PREFIXES):
                try:
                    answer = httpx.get(f"{self.url}{prefix}/openapi.json", timeout=5)
                except httpx.TransportError:
                    continue
                if answer.status_code == 200:
                    paths = answer.json()["paths"]
                    found = [p for p in API_PREFIXES if p + RESUME in paths]
                    assert found, f"no {RESUME} under any of {API_PREFIXES}: {sorted(paths)}"
                    return self.url, found[0]
            said = self.log.read_text(errors="replace")
            if (
                self.proc.poll() is not None
                and "address already in use" in said
                and (self.attempt < 3)
            ):
                return self.processes.serve(self.db_url, self.attempt + 1).ready()
            assert self.proc.poll() is None, f"keel serve exited {self.proc.returncode}:\n{said}"
            assert time.monotonic() < deadline, f"keel serve did not answer:\n{said}"
            time.sleep(0.1)


@dataclass
class Commands:
    """The `keel threads resume` racers, started (and importing Keel) before the race."""

    racers: list[Racer]
    procs: list[subprocess.Popen[str]]
    readies: list[Path]
    start: Path


def line_up_commands(processes: Processes, db_url: str, tmp_path: Path) -> Commands:
    start = tmp_path / "start"
    racers = [Racer(f"cli-{i}", "cli", f"answer of cli-{i}") for i in range(CLI_RACERS)]
    readies = [tmp_path / f"{r.by}.ready" for r in racers]
    procs = [
        processes.racer(ready, start, *resume_argv(r, db_url))
        for ready, r in zip(readies, racers, strict=True)
    ]
    return Commands(racers, procs, readies, start)


def resume_argv(racer: Racer, db_url: str) -> list[str]:
    value = json.dumps(racer.value)
    return ["threads", "resume", THREAD, value, "--db", db_url, "--by", racer.by]


def json_of(answer: httpx.Response) -> dict[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return {"text": answer.text}
    return body if isinstance(body, dict) else {"json": body}


def race(commands: Commands, url: str, prefix: str) -> list[Racer]:
    """Fire every racer at once; each comes back with what it was answered."""
    http = [Racer(f"http-{i}", "http", f"answer of http-{i}") for i in range(HTTP_RACERS)]
    lined_up = threading.Barrier(HTTP_RACERS + 1)
    go = threading.Event()
    path = prefix + RESUME.format(thread_id=THREAD)

    def answer(racer: Racer) -> None:
        try:
            with httpx.Client(base_url=url, headers=bearer(ADMIN), timeout=60) as client:
                client.get(f"{prefix}/threads/{THREAD}").raise_for_status()  # connected now
                lined_up.wait(START_TIMEOUT)
                go.wait(START_TIMEOUT)
                sent = client.post(path, json={"value": racer.value, "by": racer.by})
        except Exception as exc:  # said in the test's assertion, not lost in this thread
            lined_up.abort()
            racer.body = {"exception": repr(exc)}
            return
        racer.status, racer.body = sent.status_code, json_of(sent)
        racer.recorded = sent.status_code == 200

    clients = [threading.Thread(target=answer, args=(r,)) for r in http]
    for client in clients:
        client.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not all(ready.exists() for ready in commands.readies):
        said = [
            f"{r.by} exited {p.returncode}: {p.communicate()[1]}"
            for r, p in zip(commands.racers, commands.procs, strict=True)
            if p.poll() is not None
        ]
        assert not said and time.monotonic() < deadline, f"racers not ready: {said}"
        time.sleep(0.01)
    try:
        lined_up.wait(START_TIMEOUT)
    except threading.BrokenBarrierError:
        pytest.fail("an HTTP racer failed before the start: " + "; ".join(map(str, http)))
    commands.start.touch()
    go.set()

    for racer, proc in zip(commands.racers, commands.procs, strict=True):
        racer.stdout, racer.stderr = proc.communicate(timeout=START_TIMEOUT)
        racer.status = proc.returncode
        racer.recorded = proc.returncode == 0
    for client in clients:
        client.join(START_TIMEOUT)
    assert not any(c.is_alive() for c in clients)
    return http + commands.racers


def test_twenty_racing_answers_from_http_and_the_cli_record_exactly_one(
    db_url: str, processes: Processes, tmp_path: Path
) -> None:
    with register(keel.App(db_url)) as app:
        run_id = app.submit("ask", {"question": QUESTION}, thread_id=THREAD).run_id
        # The first worker, the server and the racers' interpreters start together.
        first = processes.worker(db_url, "worker-1")
        server = processes.serve(db_url)
        commands = line_up_commands(processes, db_url, tmp_path)
        url, prefix = server.ready()
        finished(first, processes.log("worker-1"))
        assert app.get_run(run_id).status == "waiting"
        assert app.get_thread(THREAD)["status"] == "interrupted"

        racers = race(commands, url, prefix)
        said = "\n".join(map(str, racers))
        winners = [r for r in racers if r.recorded]
        assert len(winners) == 1, said
        (winner,) = winners

        if winner.channel == "http":
            assert (winner.body["run_id"], winner.body["status"]) == (run_id, "queued"), said
        else:
            assert f"recorded: resumed by {winner.by} " in winner.stdout, said
        named = f"already answered by {winner.by} via {winner.channel}"
        for racer in racers:
            if racer is winner:
                continue
            if racer.channel == "http":
                assert (racer.status, racer.body.get("error")) == (409, "decision_conflict"), said
                assert racer.body["approval"]["value"] == winner.value, said
                assert racer.body["approval"]["run_id"] == run_id, said
                assert named in racer.body["message"], said
            else:
                # One line, no traceback: the command says who won and with what.
                assert (racer.status, racer.stdout) == (1, ""), said
                lines = racer.stderr.strip().splitlines()
                assert len(lines) == 1 and "Traceback" not in racer.stderr, said
                assert lines[0].startswith(f"error: not resumed: {named} at "), said
                assert f"with {json.dumps(winner.value)} " in lines[0], said
                assert lines[0].endswith("the first answer wins"), said

        # The wait holds the winner's answer, and the run is queued for a worker.
        details = app.get_run(run_id)
        (wait,) = details.waits
        recorded = (wait["kind"], wait["status"], wait["decided_by"], wait["channel"])
        assert recorded == ("interrupt", "decided", winner.by, winner.channel), said
        assert resume_value(loads(wait["value"])) == winner.value, said
        assert details.status == "queued", said

        finished(processes.worker(db_url, "worker-2"), processes.log("worker-2"))
        state = app.get_state(THREAD)
        assert state.values == {
            "question": QUESTION,
            "answer": winner.value,
            "log": [f"asked {QUESTION}", "done"],
        }, said
        assert state.next == (), said
        details = app.get_run(run_id)
        assert details.status == "completed", said
        kinds = Counter(e["kind"] for e in details.timeline)
        assert (kinds["decision.recorded"], kinds["status.completed"]) == (1, 1), said
        assert app.get_thread(THREAD)["status"] == "idle"
        assert [r["run_id"] for r in app.thread_runs(THREAD)] == [run_id]
