"""A run streamed through the Agent Server protocol while its `keel worker` process is SIGKILLed
mid-step, on both backends (issue 32).

The server is a real uvicorn server in this process serving the protocol's runs; the run is
executed by real `keel worker` subprocesses of this module's `app`. A langgraph-sdk client
streams a five-step run; the worker is killed while step 3 runs (steps 1 and 2 committed), a
new worker takes the run over once the dead one's lease lapsed and goes on from step 2's
checkpoint. The client's stream, kept open across the kill, and a `join_stream` from the last
event id the client had before the kill, each get every committed step's events exactly once,
the same as LangGraph's own stream of the graph; steps 1 and 2 never ran again.
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from fastapi import FastAPI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph_sdk import get_sync_client

import keel
from keel.runtime.snapshot_json import jsonable
from keel.service.agent_server import agent_server_router
from keel.service.agent_server.runs import runs_router
from keel.service.auth import Authenticator, load_tokens
from keel.service.errors import install
from keel.testing import spawn_worker
from tests.support import REPO
from tests.support.apps.service import LiveServer
from tests.support.checks import wait_until
from tests.support.crash import KILLED, LEASE_TTL, WORKER_TIMEOUT, Worker
from tests.support.service_client import ADMIN, TOKENS

pytestmark = pytest.mark.slow

APP = "tests.processes.test_agent_server_kill:app"
MARKERS = "AS_KILL_MARKERS"
STEPS = ("s1", "s2", "s3", "s4", "s5")
HELD = "s3"


class Log(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def _step(name: str) -> Any:
    def node(state: Log) -> dict[str, Any]:
        markers = Path(os.environ[MARKERS])
        with (markers / "ran").open("a") as ran:
            ran.write(f"{name}\n")
        get_stream_writer()({"step": name})  # sent only to a stream of `custom`
        if name == HELD:
            (markers / "held").touch()
            deadline = time.monotonic() + 60
            while not (markers / "go").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the test never let the step go on")
                time.sleep(0.02)
        return {"log": [name]}

    return node


def five_steps() -> StateGraph:
    """s1 -> ... -> s5; s3 waits for `<$AS_KILL_MARKERS>/go` (dropping `held` first)."""
    g = StateGraph(Log)
    for name in STEPS:
        g.add_node(name, _step(name))
    g.add_edge(START, STEPS[0])
    for a, b in itertools.pairwise(STEPS):
        g.add_edge(a, b)
    g.add_edge(STEPS[-1], END)
    return g


def register(app: keel.App) -> keel.App:
    app.workflow("five")(five_steps)
    return app


def __getattr__(name: str) -> keel.App:
    if name == "app":  # the workers' App, on $KEEL_DATABASE_URL
        return register(keel.App())
    raise AttributeError(name)


@pytest.fixture
def markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "markers"
    folder.mkdir()
    monkeypatch.setenv(MARKERS, str(folder))
    return folder


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[str]:
    app = register(keel.App(db_url, artifacts_dir=tmp_path / "artifacts"))
    api = FastAPI()
    install(api)
    auth = Authenticator(load_tokens(TOKENS))
    protocol = agent_server_router(app, auth)
    api.include_router(protocol)
    if not any(getattr(r, "path", "") == "/runs/stream" for r in protocol.routes):
        api.include_router(runs_router(app, auth))
    try:
        with LiveServer(api) as live:
            yield live.url
    finally:
        app.close()


def worker(db_url: str, tmp_path: Path, markers: Path, n: int, *args: str) -> Worker:
    log = tmp_path / f"worker-{n}.log"
    proc = spawn_worker(
        APP,
        *args,
        database_url=db_url,
        lease_ttl=LEASE_TTL,
        env={MARKERS: str(markers)},
        cwd=REPO,
        log=log,
    )
    return Worker(proc, log, None)


def test_a_stream_survives_its_worker_killed_mid_step(
    db_url: str, tmp_path: Path, markers: Path, server: str
) -> None:
    client = get_sync_client(url=server, api_key=ADMIN)
    thread = client.threads.create()["thread_id"]
    first = worker(db_url, tmp_path, markers, 1)
    modes = ["values", "updates"]
    streamed: list[Any] = []

    def follow() -> None:
        for part in client.runs.stream(thread, "five", input={"log": []}, stream_mode=modes):
            streamed.append(part)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        wait_until((markers / "held").exists, WORKER_TIMEOUT, "the run to reach step 3")

        def two_steps_streamed() -> bool:
            return any(p.event == "values" and p.data.get("log") == ["s1", "s2"] for p in streamed)

        wait_until(two_steps_streamed, WORKER_TIMEOUT, "the stream to show steps 1 and 2")
        before_kill = list(streamed)
        _kill_and_finish(first, reader, db_url, tmp_path, markers)
    finally:
        first.proc.kill()
        (markers / "go").touch()

    # Steps 1 and 2 ran once; step 3 twice (the killed execution committed nothing).
    assert (markers / "ran").read_text().split() == ["s1", "s2", "s3", "s3", "s4", "s5"]
    (markers / "ran").unlink()
    graph = five_steps().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    expected = [
        (mode, jsonable(chunk))
        for mode, chunk in graph.stream({"log": []}, config, stream_mode=modes)
    ]

    def data(parts: list[Any]) -> list[tuple[str, Any]]:
        return [(p.event, p.data) for p in parts if p.event not in ("metadata", "end")]

    # The stream kept open across the kill: every step's events once, in order.
    assert data(streamed) == expected
    assert streamed[-1].event == "end"
    ids = [p.id for p in streamed]
    assert len(ids) == len(set(ids))
    # A client that reconnects from the last event it had before the kill gets the rest.
    run_id = streamed[0].data["run_id"]
    rest = list(client.runs.join_stream(thread, run_id, last_event_id=before_kill[-1].id))
    assert [p.id for p in rest[:-1]] == ids[len(before_kill) : -1]
    assert data(before_kill) + data(rest) == expected
    assert client.runs.get(thread, run_id)["status"] == "success"


def test_a_stream_of_custom_chunks_survives_its_worker_killed_mid_step(
    db_url: str, tmp_path: Path, markers: Path, server: str
) -> None:
    """The killed execution's chunk of step 3 was streamed live; its step never committed, so
    the stream says `keel/superseded` before the re-execution's chunks, and each committed
    step's chunks come exactly once, on the open stream and on a reconnect."""
    client = get_sync_client(url=server, api_key=ADMIN)
    thread = client.threads.create()["thread_id"]
    first = worker(db_url, tmp_path, markers, 1)
    modes = ["custom", "updates"]
    streamed: list[Any] = []

    def follow() -> None:
        for part in client.runs.stream(thread, "five", input={"log": []}, stream_mode=modes):
            streamed.append(part)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:

        def live_chunk_of_step_3() -> bool:
            return any(p.event == "custom" and p.data == {"step": HELD} for p in streamed)

        wait_until(live_chunk_of_step_3, WORKER_TIMEOUT, "step 3's chunk, live")
        before_kill = list(streamed)
        _kill_and_finish(first, reader, db_url, tmp_path, markers)
    finally:
        first.proc.kill()
        (markers / "go").touch()

    assert (markers / "ran").read_text().split() == ["s1", "s2", "s3", "s3", "s4", "s5"]

    def data(parts: list[Any]) -> list[tuple[str, Any]]:
        return [(p.event, p.data) for p in parts if p.event not in ("metadata", "end")]

    def committed(parts: list[Any]) -> list[tuple[str, Any]]:
        return [(e, d) for e, d in data(parts) if e != "keel/superseded"]

    graph = five_steps().compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    expected = [
        (mode, jsonable(chunk))
        for mode, chunk in graph.stream({"log": []}, config, stream_mode=modes)
    ]
    # The open stream: what it saw before the kill (step 3's chunk included), the marker,
    # then the re-execution from step 3 on; each id once.
    events = [e for e, _ in data(streamed)]
    assert events.count("keel/superseded") == 1
    cut = events.index("keel/superseded")
    assert data(streamed)[:cut] == expected[:cut]
    assert data(streamed)[cut - 1] == ("custom", {"step": HELD})
    assert committed(streamed)[: cut - 1] + data(streamed)[cut + 1 :] == expected
    marker = data(streamed)[cut][1]
    assert marker["superseded_chunks"] == 1 and marker["lease_token"] >= 1
    ids = [p.id for p in streamed]
    assert len(ids) == len(set(ids))
    # Counted: five custom chunks and five updates committed, each once.
    shown = committed(streamed)[: cut - 1] + data(streamed)[cut + 1 :]
    assert sum(e == "custom" for e, _ in shown) == sum(e == "updates" for e, _ in shown) == 5
    # A reconnect from the superseded chunk's id: the marker, then the rest, no gap.
    run_id = streamed[0].data["run_id"]
    rest = list(client.runs.join_stream(thread, run_id, last_event_id=before_kill[-1].id))
    assert data(rest)[0][0] == "keel/superseded", [(p.id, p.event) for p in rest]
    assert [e for e, _ in data(rest)].count("keel/superseded") == 1, [(p.id, p.event) for p in rest]
    assert committed(before_kill)[:-1] + committed(rest) == expected
    # From the last event committed before it: no marker, nothing twice.
    clean = list(client.runs.join_stream(thread, run_id, last_event_id=before_kill[-2].id))
    assert committed(before_kill)[:-1] + data(clean) == expected


def _kill_and_finish(
    first: Any, reader: threading.Thread, db_url: str, tmp_path: Path, markers: Path
) -> None:
    """SIGKILL the worker holding step 3, let a second one finish the run, and wait for the
    client's open stream to end."""
    first.proc.kill()
    assert first.wait() == KILLED
    (markers / "go").touch()
    second = worker(db_url, tmp_path, markers, 2, "--stop-when-idle")
    assert second.wait() == 0, second.output()
    reader.join(WORKER_TIMEOUT)
    assert not reader.is_alive(), "the stream did not end"
