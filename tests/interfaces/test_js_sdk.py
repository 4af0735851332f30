"""The official JS client, `@langchain/langgraph-sdk`, against Keel's whole HTTP app (the
Agent Server protocol at its root) on a real uvicorn server, on both backends.

`tests/js/agent_server_check.mjs` runs in node and drives the server as a front end would:
assistants, a chat turn waited for, the thread's state, a streamed turn (values and updates),
an interrupt answered with `command: {resume}`, threads searched by metadata, and `reject` on
a busy thread. It prints what it saw as one JSON line; this test checks that line against what
Keel itself recorded.

The node modules (pinned by tests/js/package-lock.json) are installed once into a cache
directory named by the lockfile's hash ($KEEL_JS_CACHE, else ~/.cache/keel/js). Without node,
or when npm can reach no registry and nothing is cached, the test is skipped and says why.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.runtime.worker import Worker
from keel.service import create_app
from tests.support import REPO
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, TOKENS
from tests.support.thread_graphs import Ask, register

JS = REPO / "tests" / "js"
SCRIPT = "agent_server_check.mjs"
NETWORK_ERRORS = re.compile(
    r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
    r"ENOTCACHED|network request .* failed|request to .* failed"
)

GATE = threading.Event()
"""Where every "hold" run waits until the test opens it: it keeps a thread busy."""


def holding() -> Any:
    from langgraph.graph import END, START, StateGraph

    def hold(state: Ask) -> dict[str, Any]:
        assert GATE.wait(60), "the test never opened the gate"
        return {"log": ["held"]}

    g = StateGraph(Ask)
    g.add_node("hold", hold)
    g.add_edge(START, "hold")
    g.add_edge("hold", END)
    return g


def _cache_root() -> Path:
    configured = os.environ.get("KEEL_JS_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "keel" / "js"


@pytest.fixture(scope="session")
def js_project() -> Path:
    """A directory holding tests/js and its installed node modules; installed once per lockfile."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not on PATH: the JS client test needs Node 20+")
    lock = (JS / "package-lock.json").read_bytes()
    home = _cache_root() / hashlib.sha256(lock).hexdigest()[:16]
    if not (home / "node_modules").is_dir():
        _install(npm, home)
    # Copied at each session, so that an edit of the script needs no reinstall.
    shutil.copyfile(JS / SCRIPT, home / SCRIPT)
    return home


def _install(npm: str, home: Path) -> None:
    """`npm ci` in a directory of its own, then renamed to `home`: a session that stops midway
    or runs beside another leaves no half-installed `home` behind."""
    work = home.with_name(f"{home.name}.{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(JS / name, work / name)
    npm_ci = [npm, "ci", "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund"]
    done = subprocess.run(
        [*npm_ci, "--fetch-retries=1", "--prefix", str(work)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        said = done.stdout + done.stderr
        unreachable = NETWORK_ERRORS.search(said)
        if unreachable:
            pytest.skip(f"npm could reach no registry ({unreachable[0]}) and {home} is empty")
        pytest.fail(f"npm ci failed:\n{said[-4000:]}")
    try:
        work.rename(home)
    except OSError:  # another session installed it first
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def live_worker(app: keel.App) -> Iterator[None]:
    """A worker in this process executing runs as they come."""
    worker = Worker(app.aio.runtime, concurrency=2)
    loop = app.aio.runtime.portal.loop
    done = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        yield
    finally:
        GATE.set()
        loop.call_soon_threadsafe(worker.stop)
        done.result(timeout=30)


def run_script(project: Path, url: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    env = {**os.environ, "KEEL_URL": url, "KEEL_TOKEN": ADMIN}
    done = subprocess.run(
        ["node", SCRIPT], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"the script printed nothing (exit {done.returncode}):\n{done.stderr}"
    return json.loads(lines[-1]), done


def test_the_js_client_drives_keel(make_app: Callable[..., keel.App], js_project: Path) -> None:
    GATE.clear()
    app = register(make_app(lease_ttl=5))
    app.workflow("hold")(holding)
    with LiveServer(create_app(app, tokens=TOKENS)) as live, live_worker(app):
        report, done = run_script(js_project, live.url)
        GATE.set()
        held = app.wait(report["held_run_id"], timeout=30)

    assert report["problems"] == [], f"{report}\n{done.stderr}"
    assert done.returncode == 0, done.stderr

    assert {"ask", "chat", "hold"} <= set(report["assistants"])
    assert report["wait_texts"] == ["hi", "echo: hi"]
    assert report["wait_turns"] == 1
    assert report["state"] == {"texts": ["hi", "echo: hi"], "turns": 1, "next": []}

    # Each step's `values` then its `updates`, after the `metadata` event that opens a stream.
    assert report["stream_events"][0] == "metadata"
    assert report["stream_events"].count("values") == len(report["stream_values"]) >= 2
    assert report["stream_updates"] == [["reply"]]
    assert report["stream_reply"] == ["echo: again"]
    assert report["stream_values"][-1] == ["hi", "echo: hi", "again", "echo: again"]
    assert report["stream_run_status"] == "success"
    chat_runs = app.thread_runs(report["chat_thread_id"])
    assert [r["status"] for r in chat_runs] == ["completed", "completed"]
    assert chat_runs[1]["run_id"] == report["stream_run_id"]

    assert report["paused"] == {
        "next": ["ask"],
        "task_interrupts": [{"question": "colour?"}],
        "thread_status": "interrupted",
    }
    assert report["resumed"] == {
        "answer": "blue",
        "log": ["asked colour?", "done"],
        "thread_status": "idle",
    }
    # The resume continued the same Keel run: one run on the thread, completed.
    ask_runs = app.thread_runs(report["ask_thread_id"])
    assert [r["status"] for r in ask_runs] == ["completed"]

    assert report["search_tag"] == sorted([report["chat_thread_id"], report["ask_thread_id"]])
    assert report["search_graph_ask"] == [report["ask_thread_id"]]

    assert report["reject"] == {"status": 409, "error": "HTTPError"}
    busy_runs = app.thread_runs(report["busy_thread_id"])
    assert [r["run_id"] for r in busy_runs] == [report["held_run_id"]]
    assert held["status"] == "completed"
