"""Durability through the LangGraph Agent Server protocol: `keel serve` and `keel worker`
processes SIGKILLed together, a langgraph-sdk client the only driver, on both backends (issue 32).

Every step of this module's `durable` workflow writes a line to `<markers>/ran` (so a node that
ran again shows twice) and then calls `post_step`, a `@keel.effect` of
tests/support/apps/threads.py that POSTs to a real HTTP provider counting every POST (a second
send would be a second delivery). With `hold`, step 2 drops `<markers>/<name>.held` after its
effect and waits for `<markers>/<name>.go`, so a test knows the run is in the middle.

- `runs.create()` answers only after the run is admitted durably: the server and the worker
  SIGKILLed 0.5 s after it answered, then restarted, the run completes, each effect once;
- a run whose server and worker are SIGKILLed while step 2 runs completes after restart from
  step 1's checkpoint: step 1 does not run again, step 2's effect is not sent again;
- cancel stops a running run at its next step boundary: the step in flight finishes, no later
  step runs, and the run reads `interrupted`;
- a stream whose SERVER is SIGKILLed mid-run (the worker lives on and finishes the run alone)
  is picked up from a restarted server with `join_stream` and the last event id the client
  had: every event exactly once, no gap. (tests/processes/test_agent_server_kill.py kills the
  worker instead.)
"""

from __future__ import annotations

import contextlib
import operator
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.schema import StreamMode

import keel
from keel.testing import spawn_worker
from keel.testing.http import HttpSink
from tests.support import REPO
from tests.support.apps import threads
from tests.support.checks import wait_until
from tests.support.crash import KILLED, LEASE_TTL, WORKER_TIMEOUT
from tests.support.service_client import ADMIN, free_port

pytestmark = pytest.mark.slow

APP = "tests.processes.test_agent_server_durability:app"
STEPS = 4
HOLD_AT = 2
HOLD_LIMIT = 60.0


class Steps(TypedDict, total=False):
    name: str
    hold: bool
    done: Annotated[list[str], operator.add]


def _markers() -> Path:
    return Path(os.environ["THREADS_MARKERS"])


def _step(k: int) -> Any:
    def node(state: Steps) -> Steps:
        name = state["name"]
        with (_markers() / "ran").open("a") as ran:
            ran.write(f"{name} {k}\n")
        threads.post_step(name, k)
        if k == HOLD_AT and state.get("hold"):
            (_markers() / f"{name}.held").touch()
            deadline = time.monotonic() + HOLD_LIMIT
            while not (_markers() / f"{name}.go").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never let the step go on")
                time.sleep(0.02)
        return {"done": [f"{name} {k}"]}

    node.__name__ = f"step{k}"
    return node


def durable() -> StateGraph:
    g = StateGraph(Steps)
    previous = START
    for k in range(1, STEPS + 1):
        g.add_node(f"step{k}", _step(k))
        g.add_edge(previous, f"step{k}")
        previous = f"step{k}"
    g.add_edge(previous, END)
    return g


def register(app: keel.App) -> keel.App:
    app.workflow("durable")(durable)
    return app


def __getattr__(name: str) -> keel.App:
    if name == "app":  # the server's and the workers' App, on $KEEL_DATABASE_URL
        return register(keel.App())
    raise AttributeError(name)


@dataclass
class Keel:
    """The test's `keel serve` and `keel worker` processes, all on one database."""

    db_url: str
    sink: HttpSink
    markers: Path
    tmp_path: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {"THREADS_SINK_URL": self.sink.url, "THREADS_MARKERS": str(self.markers)}

    def _log(self, name: str) -> Path:
        log = self.tmp_path / f"{len(self.logs) + 1}-{name}.log"
        self.logs.append(log)
        return log

    def start(self) -> tuple[SyncLangGraphClient, list[subprocess.Popen[bytes]]]:
        """A server and a worker, started side by side; a client once the server answers."""
        worker = spawn_worker(
            APP,
            database_url=self.db_url,
            lease_ttl=LEASE_TTL,
            env=self.env(),
            cwd=REPO,
            log=self._log("worker"),
        )
        self.procs.append(worker)
        client, server = self.serve()
        return client, [server, worker]

    def serve(self) -> tuple[SyncLangGraphClient, subprocess.Popen[bytes]]:
        """A `keel serve` (no worker); a client once it answers."""
        for _ in range(3):  # another test may take the free port before the bind
            server, url, log = self._serve()
            if self._answers(server, url, log):
                client = get_sync_client(url=url, api_key=ADMIN, timeout=WORKER_TIMEOUT * 2)
                return client, server
        raise AssertionError(f"keel serve did not start:\n{self.output()}")

    def _serve(self) -> tuple[subprocess.Popen[bytes], str, Path]:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
        env.update(
            self.env(),
            KEEL_DATABASE_URL=self.db_url,
            KEEL_API_TOKENS=f"{ADMIN}=*",
            PYTHONUNBUFFERED="1",
        )
        log = self._log("serve")
        command = [sys.executable, "-m", "keel", "serve", APP, "--port", str(port)]
        with log.open("wb") as out:
            server = subprocess.Popen(
                [*command, "--log-level", "warning"],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(server)
        return server, f"http://127.0.0.1:{port}", log

    def _answers(self, server: subprocess.Popen[bytes], url: str, log: Path) -> bool:
        deadline = time.monotonic() + WORKER_TIMEOUT
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ok", timeout=5).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                said = log.read_text(errors="replace")
                assert "address already in use" in said, f"keel serve exited:\n{said}"
                return False
            time.sleep(0.05)
        raise AssertionError(f"keel serve did not answer:\n{log.read_text(errors='replace')}")

    def kill(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """SIGKILL every process of `procs` at once: no clean shutdown of any."""
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            assert proc.wait(30) == KILLED, f"exited {proc.returncode}:\n{self.output()}"

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def output(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in self.logs
        )

    def ran(self) -> list[str]:
        """The steps' executions, in order (a step that ran again appears twice)."""
        path = self.markers / "ran"
        return path.read_text().splitlines() if path.exists() else []

    def delivered(self) -> list[str]:
        """What the provider received, in arrival order: one entry per POST."""
        return [
            f"{body['name']} {body['step']}"
            for body in (d.json() for d in self.sink.deliveries if d.route == "/steps")
        ]


@pytest.fixture
def keel_processes(db_url: str, tmp_path: Path) -> Iterator[Keel]:
    markers = tmp_path / "markers"
    markers.mkdir()
    with HttpSink() as sink:
        harness = Keel(db_url, sink, markers, tmp_path)
        try:
            yield harness
        finally:
            harness.stop_all()


def all_steps(name: str) -> list[str]:
    return [f"{name} {k}" for k in range(1, STEPS + 1)]


def test_a_run_created_is_admitted_durably_a_kill_half_a_second_later_loses_nothing(
    keel_processes: Keel,
) -> None:
    k = keel_processes
    client, first = k.start()
    thread = client.threads.create()["thread_id"]
    run = client.runs.create(thread, "durable", input={"name": "a", "done": []})
    assert run["status"] == "pending"
    time.sleep(0.5)  # the scenario: every Keel process dies half a second after the answer
    k.kill(first)

    client, _ = k.start()
    values = client.runs.join(thread, run["run_id"])
    why = k.output()
    assert values["done"] == all_steps("a"), why
    assert client.runs.get(thread, run["run_id"])["status"] == "success", why
    # Admitted once: the thread holds that one run, not a retry's second.
    assert [r["run_id"] for r in client.runs.list(thread)] == [run["run_id"]], why
    # Each step's effect reached the provider once, whatever the kill interrupted.
    assert k.delivered() == all_steps("a"), why
    assert client.threads.get_state(thread)["values"]["done"] == all_steps("a"), why


def test_a_run_killed_mid_run_with_its_server_resumes_from_its_last_checkpoint(
    keel_processes: Keel,
) -> None:
    k = keel_processes
    client, first = k.start()
    thread = client.threads.create()["thread_id"]
    run = client.runs.create(thread, "durable", input={"name": "b", "hold": True, "done": []})
    held = k.markers / "b.held"
    wait_until(held.exists, WORKER_TIMEOUT, f"step {HOLD_AT} to run:\n{k.output()}")
    assert client.runs.get(thread, run["run_id"])["status"] == "running"
    # Step 1 committed, step 2 sent its effect and is still running: now every process dies.
    assert (k.ran(), k.delivered()) == (["b 1", "b 2"], ["b 1", "b 2"])
    k.kill(first)
    (k.markers / "b.go").touch()

    client, _ = k.start()
    values = client.runs.join(thread, run["run_id"])
    why = k.output()
    assert values["done"] == all_steps("b"), why
    assert client.runs.get(thread, run["run_id"])["status"] == "success", why
    # Step 1 did not run again; step 2, killed before it committed, ran again from step 1's
    # checkpoint, and its effect came from the ledger rather than a second send.
    assert k.ran() == ["b 1", "b 2", "b 2", "b 3", "b 4"], why
    assert k.delivered() == all_steps("b"), why


def test_cancel_stops_a_running_run_at_its_next_step_boundary(keel_processes: Keel) -> None:
    k = keel_processes
    client, _ = k.start()
    thread = client.threads.create()["thread_id"]
    run = client.runs.create(thread, "durable", input={"name": "c", "hold": True, "done": []})
    wait_until((k.markers / "c.held").exists, WORKER_TIMEOUT, f"step 2 to run:\n{k.output()}")
    client.runs.cancel(thread, run["run_id"])
    # The step in flight is not interrupted: it finishes, and the run stops after it.
    assert client.runs.get(thread, run["run_id"])["status"] == "running"
    (k.markers / "c.go").touch()
    client.runs.join(thread, run["run_id"])
    why = k.output()
    assert client.runs.get(thread, run["run_id"])["status"] == "interrupted", why
    assert k.ran() == ["c 1", "c 2"], why
    assert k.delivered() == ["c 1", "c 2"], why
    # The thread shows where it stopped: step 2's writes committed, step 3 next, never run.
    state = client.threads.get_state(thread)
    assert (state["values"]["done"], state["next"]) == (["c 1", "c 2"], ["step3"]), why
    assert client.threads.get(thread)["status"] == "idle", why
    # The thread is free for the next run, which runs to its end. (`hold` is thread state: the
    # cancelled run's True would hold this one too.)
    after = client.runs.create(thread, "durable", input={"name": "d", "hold": False})
    client.runs.join(thread, after["run_id"])
    assert client.runs.get(thread, after["run_id"])["status"] == "success", k.output()
    assert k.ran() == ["c 1", "c 2", *all_steps("d")], k.output()


def test_a_stream_resumes_from_a_restarted_server_after_its_server_was_killed_mid_run(
    keel_processes: Keel,
) -> None:
    k = keel_processes
    client, (server, worker) = k.start()
    thread = client.threads.create()["thread_id"]
    modes: list[StreamMode] = ["values", "updates"]
    stream = client.runs.stream(
        thread, "durable", input={"name": "e", "hold": True, "done": []}, stream_mode=modes
    )
    seen = []
    for part in stream:
        seen.append(part)
        if part.event == "updates" and "step1" in part.data:
            break
    run_id = seen[0].data["run_id"]
    wait_until((k.markers / "e.held").exists, WORKER_TIMEOUT, f"step 2 to run:\n{k.output()}")
    # The server dies with the client's stream open on it; the worker lives on.
    k.kill([server])
    with contextlib.suppress(Exception):  # the connection died with the server
        stream.close()  # type: ignore[attr-defined]
    client.http.client.close()
    (k.markers / "e.go").touch()
    # The worker finishes the run with no server up.
    wait_until(lambda: "e 4" in k.ran(), WORKER_TIMEOUT, f"the run to end:\n{k.output()}")

    client, _ = k.serve()
    rest = list(
        client.runs.join_stream(thread, run_id, stream_mode=modes, last_event_id=seen[-1].id)
    )
    why = k.output()
    assert worker.poll() is None, why  # the one worker ran it all: no takeover hid a gap
    assert rest[-1].event == "end" and all(p.event != "metadata" for p in rest), why
    whole = seen + rest
    ids = [p.id for p in whole]
    assert len(ids) == len(set(ids)), ids
    updates = [p.data for p in whole if p.event == "updates"]
    assert updates == [{f"step{n}": {"done": [f"e {n}"]}} for n in range(1, STEPS + 1)], why
    values = [p.data["done"] for p in whole if p.event == "values"]
    assert values[-1] == all_steps("e"), why
    # The same as the whole stream replayed from the start of the run: nothing missing.
    replay = list(client.runs.join_stream(thread, run_id, stream_mode=modes, last_event_id="-1"))
    assert replay[0].event == "metadata", why  # useStream's rejoin: `metadata` first
    assert [(p.event, p.data) for p in replay[1:]] == [(p.event, p.data) for p in whole[1:]], why
    assert client.runs.get(thread, run_id)["status"] == "success", why
    assert k.ran() == all_steps("e") and k.delivered() == all_steps("e"), why
