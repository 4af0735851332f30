"""Agent Servers as real processes for the bench: a langgraph.json project, `langgraph dev`,
`keel dev`, and `keel serve` beside a `keel worker`.

Each server starts on a free port in a folder of its own (langgraph dev keeps its pickled state
in the folder it runs in), answers `/ok` before it is measured, and is stopped by its process
group (the one the bench started) at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import suppress
from pathlib import Path

GRAPH_ID = "five"
NODES = ("a", "b", "c", "d", "e")
GRAPH_PY = f'''"""The bench's 5-node graph: each node adds one to `n` and its name to `steps`."""

import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    n: int
    steps: Annotated[list[str], operator.add]


def node(name: str):
    def step(state: State) -> State:
        return {{"n": state.get("n", 0) + 1, "steps": [name]}}

    return step


builder = StateGraph(State)
NODES = {NODES!r}
for name in NODES:
    builder.add_node(name, node(name))
builder.add_edge(START, NODES[0])
for left, right in zip(NODES, NODES[1:]):
    builder.add_edge(left, right)
builder.add_edge(NODES[-1], END)
graph = builder.compile()
'''
CONFIG_JSON = json.dumps({"dependencies": ["."], "graphs": {GRAPH_ID: "./graph.py:graph"}})
DEV_ENV = "KEEL_LANGGRAPH_DEV"
DEV_DEFAULT = Path("/tmp/lgdev/bin/langgraph")


class ServerError(RuntimeError):
    pass


def write_project(folder: Path) -> Path:
    """The langgraph.json project both servers load; returns its config file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "graph.py").write_text(GRAPH_PY)
    config = folder / "langgraph.json"
    config.write_text(CONFIG_JSON)
    return config


def langgraph_cli() -> Path | None:
    """The `langgraph` CLI (with `[inmem]`): $KEEL_LANGGRAPH_DEV, /tmp/lgdev, or on PATH."""
    for candidate in (os.environ.get(DEV_ENV), str(DEV_DEFAULT), shutil.which("langgraph")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "LANGGRAPH_"))}
    env.update(NO_COLOR="1", LANGGRAPH_NO_VERSION_CHECK="true", LANGSMITH_TRACING="false")
    env.update(extra)
    return env


class Server:
    """One or more processes answering the Agent Server API at `url`."""

    def __init__(self, name: str, folder: Path, api_key: str | None = None) -> None:
        self.name = name
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, label: str, args: list[str], env: dict[str, str]) -> None:
        log = (self.folder / f"{label}.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                args,
                cwd=self.folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in self.folder.glob("*.log"))

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise ServerError(f"{self.name} exited ({proc.returncode}): {self.logs()}")
            with (
                suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/ok", timeout=2) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.2)
        raise ServerError(f"{self.name} did not answer /ok in {timeout:.0f} s: {self.logs()}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def langgraph_dev(cli: Path, folder: Path, jobs: int = 10) -> Server:
    write_project(folder)
    server = Server("langgraph dev", folder)
    args = [str(cli), "dev", "--port", str(server.port), "--no-browser", "--no-reload"]
    args += ["--n-jobs-per-worker", str(jobs), "--server-log-level", "WARNING"]
    server.spawn("langgraph-dev", args, _clean_env())
    return server


def keel_dev(folder: Path, db: str, concurrency: int = 10) -> Server:
    write_project(folder)
    server = Server("keel dev", folder)
    args = [sys.executable, "-m", "keel", "dev", "--config", "langgraph.json", "--db", db]
    args += ["--port", str(server.port), "--concurrency", str(concurrency)]
    server.spawn("keel-dev", [*args, "--log-level", "warning"], _clean_env())
    return server


def keel_serve_and_worker(folder: Path, db: str, concurrency: int = 10) -> Server:
    """`keel serve --config` and one `keel worker --config`, on a migrated database."""
    from keel.runtime.project import load_project

    config = write_project(folder)
    app = load_project(config, url=db)
    try:
        app.migrate()
    finally:
        app.close()
    token = secrets.token_urlsafe(32)
    server = Server("keel serve + worker", folder, api_key=token)
    env = _clean_env(KEEL_API_TOKENS=f"{token}=*")
    common = ["--config", "langgraph.json", "--db", db, "--log-level", "warning"]
    keel = [sys.executable, "-m", "keel"]
    server.spawn("keel-serve", [*keel, "serve", *common, "--port", str(server.port)], env)
    server.spawn("keel-worker", [*keel, "worker", *common, "--concurrency", str(concurrency)], env)
    return server
