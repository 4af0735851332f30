"""A thread deleted and made again with the same id starts with no run.

Keel keeps a deleted thread's runs until retention (docs/threads.md), but they are not the runs
of a new thread that takes the id: LangGraph's server deletes them with the thread, so a client
that recreates a thread (`if_exists`, a run's `if_not_exists="create"`) expects an empty one.
The old runs named the id and were listed as the new thread's, made its status `error` when the
last had failed, were joined, and counted in a status search."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError
from typing_extensions import TypedDict

import keel
from keel.service import create_app
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, TOKENS
from tests.support.thread_graphs import register
from tests.support.workers import drain


class Boom(TypedDict, total=False):
    text: str


def failing() -> StateGraph:
    def fail(state: Boom) -> dict[str, Any]:
        raise ValueError(f"no: {state.get('text')}")

    g = StateGraph(Boom)
    g.add_node("fail", fail)
    g.add_edge(START, "fail")
    g.add_edge("fail", END)
    return g


class Served:
    def __init__(self, app: keel.App, url: str) -> None:
        self.app = app
        self.client: SyncLangGraphClient = get_sync_client(url=url, api_key=ADMIN)
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"})


@pytest.fixture
def served(make_app: Callable[..., keel.App]) -> Iterator[Served]:
    """The thread graphs and `boom` (a run of it fails), behind the Agent Server protocol and
    Keel's own `/v1` threads."""
    app = register(make_app(lease_ttl=5))
    app.workflow("boom")(failing)
    with LiveServer(create_app(app, tokens=TOKENS)) as server:
        here = Served(app, server.url)
        yield here
        here.http.close()
        here.client.http.client.close()


def gone(call: Callable[[], Any]) -> bool:
    """Whether the call was answered 404 (the SDK's join raises httpx's own error)."""
    try:
        call()
    except (NotFoundError, httpx.HTTPStatusError) as exc:
        return exc.response.status_code == 404
    return False


def say(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def test_a_thread_made_again_has_none_of_the_deleted_ones_runs(served: Served) -> None:
    c, app, http = served.client, served.app, served.http
    c.threads.create(thread_id="t-re", graph_id="boom")
    old = c.runs.create("t-re", "boom", input={"text": "x"})
    drain(app)
    assert c.runs.get("t-re", old["run_id"])["status"] == "error"
    assert c.threads.get("t-re")["status"] == "error"
    c.threads.delete("t-re")

    made = c.threads.create(thread_id="t-re", if_exists="do_nothing")
    assert made["status"] == "idle"
    assert c.threads.get("t-re")["status"] == "idle"
    assert c.runs.list("t-re") == []
    assert http.get("/v1/threads/t-re/runs").json() == []
    assert http.get("/v1/threads/t-re").json()["runs"] == 0
    for reach in (c.runs.get, c.runs.join, c.runs.delete):
        assert gone(functools.partial(reach, "t-re", old["run_id"]))
    assert "t-re" not in [t["thread_id"] for t in c.threads.search(status="error")]
    assert c.threads.count(status="error") == 0
    # The deleted thread's run stays on record, by its own id.
    assert app.get_run(old["run_id"]).status == "failed"

    # The new thread's runs are its own, in order after the old ones' places.
    new = c.runs.create("t-re", "chat", input=say("hi"))
    drain(app)
    assert c.runs.join("t-re", new["run_id"])["messages"][-1]["content"] == "echo: hi"
    assert [r["status"] for r in c.runs.list("t-re")] == ["success"]
    assert [r["thread_seq"] for r in http.get("/v1/threads/t-re/runs").json()] == [2]
    assert c.threads.get("t-re")["status"] == "idle"


def test_a_run_that_makes_its_thread_again_is_its_only_run(served: Served) -> None:
    c, app = served.client, served.app
    first = c.runs.create("t-run", "chat", input=say("one"), if_not_exists="create")
    drain(app)
    c.threads.delete("t-run")

    again = c.runs.create("t-run", "chat", input=say("two"), if_not_exists="create")
    drain(app)
    assert [r["run_id"] for r in c.runs.list("t-run")] == [again["run_id"]]
    assert c.runs.join("t-run", again["run_id"])["messages"][-1]["content"] == "echo: two"
    assert gone(lambda: c.runs.join("t-run", first["run_id"]))
    # A copy onto the old id (deleted again first) is as new.
    c.threads.delete("t-run")
    c.threads.create(thread_id="t-src", graph_id="chat")
    copied = served.http.post("/v1/threads/t-src/copy", json={"to": "t-run"})
    assert copied.status_code == 201, copied.text
    assert copied.json()["runs"] == 0 and c.runs.list("t-run") == []
    assert c.threads.get("t-run")["status"] == "idle"


def test_deleting_still_waits_for_an_unfinished_run(served: Served) -> None:
    c, app = served.client, served.app
    run = c.runs.create("t-busy", "ask", input={"question": "q?"}, if_not_exists="create")
    drain(app)  # it waits on its interrupt
    assert c.threads.get("t-busy")["status"] == "interrupted"
    with pytest.raises(ConflictError):
        c.threads.delete("t-busy")
    c.runs.cancel("t-busy", run["run_id"])
    drain(app)
    c.threads.delete("t-busy")
    made = c.threads.create(thread_id="t-busy")
    assert made["status"] == "idle" and c.runs.list("t-busy") == []
