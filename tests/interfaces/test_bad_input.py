"""Bad input over HTTP gets a clear 4xx and changes nothing, on every route, both backends:
values nested past what can be kept, text that is not valid Unicode, numbers past what the
database holds, configs of the wrong shape, unreachable ids, a batch with one bad item, a state
update that is not an object. Before, each was a 500, or was written and broke later reads, or
failed its run in the worker (a review's reproductions)."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import keel
from keel.core.codec import MAX_DEPTH
from keel.core.errors import InvalidInput
from keel.service import create_app
from tests.support.apps.service import WORKFLOW, LiveServer
from tests.support.graphs import echo_graph
from tests.support.service_client import ADMIN, TOKENS, Service, bearer
from tests.support.workers import drain


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def counts(svc: Service) -> tuple[int, int]:
    """Threads and runs on record."""
    threads = svc.http.post("/threads/search", json={}).json()
    return len(threads), len(svc.http.get("/v1/runs").json()["runs"])


TOO_DEEP = nested(MAX_DEPTH + 5)
SURROGATE = json.loads('"\\ud800"')  # valid JSON, not valid Unicode
NUL = "a\u0000b"  # valid JSON and Unicode; PostgreSQL's text and jsonb cannot hold it

ROUTES: list[tuple[str, str, Callable[[Any], dict[str, Any]]]] = [
    ("POST", "/threads", lambda bad: {"metadata": {"m": bad}}),
    ("POST", "/assistants", lambda bad: {"graph_id": WORKFLOW, "metadata": {"m": bad}}),
    ("POST", "/runs", lambda bad: {"assistant_id": WORKFLOW, "input": {"topic": bad}}),
    ("POST", "/v1/runs", lambda bad: {"workflow": WORKFLOW, "job_id": "j", "input": {"t": bad}}),
    ("PUT", "/store/items", lambda bad: {"namespace": ["a"], "key": "k", "value": {"v": bad}}),
    ("POST", "/assistants/search", lambda bad: {"metadata": {"m": bad}}),
    ("POST", "/v1/threads", lambda bad: {"workflow": WORKFLOW, "metadata": {"m": bad}}),
    ("POST", "/threads/search", lambda bad: {"metadata": {"m": bad}}),
    ("PATCH", "/threads/t-bad", lambda bad: {"metadata": {"m": bad}}),
    ("POST", "/threads/t-bad/state", lambda bad: {"values": {"topic": bad}}),
    ("POST", "/threads/t-bad/runs", lambda bad: {"assistant_id": WORKFLOW, "metadata": {"m": bad}}),
    (
        "POST",
        "/runs/crons",
        lambda bad: {"assistant_id": WORKFLOW, "schedule": "0 3 * * *", "input": {"topic": bad}},
    ),
    ("POST", "/store/items/search", lambda bad: {"namespace_prefix": ["a"], "filter": {"v": bad}}),
]


SAID = {
    "too deep": "deeper than",
    "surrogate": "not valid Unicode",
    "nan": "JSON cannot carry",
    "past 64 bits": "integer past 64 bits",
    "nul": "PostgreSQL cannot store",
}


@pytest.mark.parametrize(
    ("bad", "case"),
    [
        (TOO_DEEP, "too deep"),
        (SURROGATE, "surrogate"),
        (math.nan, "nan"),
        ([2**64, -(2**63) - 1], "past 64 bits"),
        (NUL, "nul"),
    ],
)
def test_a_value_that_cannot_be_kept_is_422_and_nothing_is_written(
    svc: Service, bad: Any, case: str
) -> None:
    said = SAID[case]
    svc.http.post("/threads", json={"thread_id": "t-bad", "graph_id": WORKFLOW})
    for method, path, body in ROUTES:
        before = counts(svc)
        # As a client sends it: the surrogate escaped (`\ud800`), which is valid JSON.
        sent = json.dumps(body(bad)).encode()
        headers = {"Content-Type": "application/json"}
        answer = svc.http.request(method, path, content=sent, headers=headers)
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["error"] == "invalid_input"
        assert said in answer.json()["message"]
        assert counts(svc) == before, path
    # Every read still answers (a deep thread's metadata made searching fail for everyone).
    assert svc.http.post("/threads/search", json={}).status_code == 200
    assert svc.http.post("/assistants/search", json={}).status_code == 200


def test_the_python_api_refuses_what_it_could_not_run_or_record(make_app: Any) -> None:
    """Past the HTTP door too: an input, a thread's command or an answer nested past what
    LangGraph's serializer takes failed the run in the worker (the answer: the turn lost)."""
    app = make_app()
    app.workflow("echo")(__import__("tests.support.graphs", fromlist=["echo_graph"]).echo_graph)
    with pytest.raises(InvalidInput, match="deeper than"):
        app.submit("echo", {"text": TOO_DEEP})
    with pytest.raises(InvalidInput, match="deeper than"):
        app.submit("echo", {"text": "t"}, thread_id="t", config={"metadata": {"m": TOO_DEEP}})
    with pytest.raises(InvalidInput, match="not valid Unicode"):
        app.submit("echo", {"text": SURROGATE}, thread_id="t")
    with pytest.raises(InvalidInput, match="JSON cannot carry"):
        app.create_thread("echo", metadata={"a": math.inf})
    # Admitted, it failed its run at the first checkpoint (msgpack keeps 64 bits).
    with pytest.raises(InvalidInput, match="integer past 64 bits"):
        app.submit("echo", {"n": [2**70]})
    assert app.list_runs() == []
    largest = app.submit("echo", {"n": [2**64 - 1, -(2**63)]}).run_id
    drain(app)
    assert app.get_run(largest).status == "completed"


def test_the_python_api_refuses_a_nul_on_both_backends(make_app: Any) -> None:
    """A NUL (`\\u0000`) in any text given to keep: PostgreSQL's text and jsonb cannot hold
    it (a thread's metadata with one was kept, and every search after it failed); refused on
    SQLite too, so that a value kept there can move to PostgreSQL. The message says where."""
    app = make_app()
    app.workflow("echo")(__import__("tests.support.graphs", fromlist=["echo_graph"]).echo_graph)
    said = "PostgreSQL cannot store"
    with pytest.raises(InvalidInput, match=r'input at \["text"\]\[1\] holds a NUL'):
        app.submit("echo", {"text": ["ok", NUL]})
    with pytest.raises(InvalidInput, match=said):
        app.submit("echo", {"text": "t"}, thread_id="t", metadata={"m": NUL})
    with pytest.raises(InvalidInput, match=said):
        app.submit("echo", {"text": "t"}, thread_id="t", merge_metadata={"m": NUL})
    with pytest.raises(InvalidInput, match=said):
        app.submit("echo", {"text": "t"}, thread_id="t", context={"c": NUL})
    with pytest.raises(InvalidInput, match=r"its key \[\"k\\u0000\"\]"):
        app.create_thread("echo", metadata={"k\u0000": 1})
    assert app.list_runs() == []
    thread = app.create_thread("echo", thread_id="kept")
    with pytest.raises(InvalidInput, match=said):
        app.update_thread(thread["thread_id"], metadata={"m": NUL})
    assert app.get_thread("kept")["metadata"] == {}
    assert app.search_threads() != []  # every search still answers


def test_numbers_timezones_configs_and_ids_past_what_can_be_kept_are_refused(
    svc: Service,
) -> None:
    for method, path, body in [
        ("POST", "/threads/search", {"offset": 2**63}),
        ("POST", "/store/namespaces", {"max_depth": 2**63}),
        ("GET", "/v1/runs?offset=9223372036854775808", None),
    ]:
        answer = svc.http.request(method, path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        assert "out of range" in answer.json()["message"]
    # zoneinfo opened a folder of the tz database, or a name past a file name's length.
    for timezone in ["America", "Etc", "x" * 300]:
        schedule = {"name": "n", "workflow": WORKFLOW, "cron": "0 3 * * *", "timezone": timezone}
        answer = svc.http.post("/v1/schedules", json={**schedule, "input": {"topic": "t"}})
        assert answer.status_code == 400, answer.text
        assert "unknown timezone" in answer.json()["message"]
    assert svc.http.get("/v1/schedules").json()["schedules"] == []
    # A config of another shape failed every run (of an assistant holding it).
    before = counts(svc)
    for config in [{"configurable": 5}, {"metadata": "x"}, {"tags": 5}, {"tags": [1]}]:
        for path, body in [
            ("/runs", {"assistant_id": WORKFLOW, "input": {"topic": "t"}, "config": config}),
            ("/assistants", {"graph_id": WORKFLOW, "config": config}),
        ]:
            answer = svc.http.post(path, json=body)
            assert answer.status_code == 422, (path, config, answer.text)
            assert "config" in answer.json()["message"]
    # An assistant id no path can name was created, never to be read or deleted again.
    for assistant_id in ["a/b", "../x", "?q", " "]:
        body = {"graph_id": WORKFLOW, "assistant_id": assistant_id}
        assert svc.http.post("/assistants", json=body).status_code == 422, assistant_id
    assert counts(svc) == before
    assert len(svc.http.post("/assistants/search", json={}).json()) == 2  # the graphs' own


def test_a_batch_with_a_bad_run_admits_none(svc: Service) -> None:
    good = {"assistant_id": WORKFLOW, "input": {"topic": "t"}}
    for second, status in [
        ({"assistant_id": "nope"}, 404),
        ({"assistant_id": WORKFLOW, "input": {"nope": 1}}, 422),
    ]:
        answer = svc.http.post("/runs/batch", json=[good, second])
        assert answer.status_code == status, answer.text
        assert answer.json()["message"].startswith("run 1: ")
        assert counts(svc) == (0, 0), "a client retrying the refused batch admitted it twice"


def test_a_state_update_that_is_not_an_object_is_422_and_admits_nothing(svc: Service) -> None:
    svc.http.post("/threads", json={"thread_id": "t-s", "graph_id": WORKFLOW})
    svc.http.post("/threads/t-s/runs", json={"assistant_id": WORKFLOW, "input": {"topic": "t"}})
    before = counts(svc)
    for values in [True, "hello", [1, 2]]:
        answer = svc.http.post("/v1/threads/t-s/state", json={"values": values, "timeout": 0})
        assert answer.status_code == 422, answer.text
        assert "expected an object" in answer.json()["message"]
    # The Agent Server answers a list as langgraph-api does (400), the others 422 as it does.
    for values, status in [(True, 422), ("hello", 422), ([1, 2], 400)]:
        answer = svc.http.post("/threads/t-s/state", json={"values": values})
        assert (answer.status_code, answer.json()["error"]) == (status, "invalid_input"), values
        assert "expected an object" in answer.json()["message"]
    assert counts(svc) == before


@pytest.mark.parametrize("backend", ["sqlite"])  # PostgreSQL never kept such metadata
def test_a_thread_whose_stored_metadata_holds_a_nul_still_takes_runs(
    make_app: Callable[..., keel.App], db_url: str
) -> None:
    """A thread's metadata kept on SQLite before NULs were refused: every Agent Server run on
    it was a 422 on `config`, which the client never sent (the thread's metadata is copied into
    each run's config). The run works; the entry no database may keep any more is left out of
    the copy, and the thread shows what it holds until a PATCH replaces it."""
    app = make_app()
    app.workflow("echo")(echo_graph)
    with LiveServer(create_app(app, tokens=TOKENS)) as server:
        http = httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=60)
        metadata = {"note": "ok", "owner": "ana"}
        assert http.post("/threads", json={"thread_id": "t", "metadata": metadata}).is_success
        kept = json.dumps({"note": NUL, "owner": "ana"})
        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as db:
            db.execute("UPDATE keel_threads SET metadata = ? WHERE thread_id = 't'", (kept,))
        db.close()
        answer = http.post(
            "/threads/t/runs", json={"assistant_id": "echo", "input": {"text": "hi"}}
        )
        assert answer.status_code == 200, answer.text
        drain(app)
        run = http.get(f"/threads/t/runs/{answer.json()['run_id']}").json()
        assert run["status"] == "success"
        assert http.get("/threads/t/state").json()["values"]["out"] == "HI"
        [checkpoint] = http.post("/threads/t/history", json={"limit": 1}).json()
        assert checkpoint["metadata"]["owner"] == "ana"  # the rest of it is copied as before
        assert "note" not in checkpoint["metadata"]
        assert http.get("/threads/t").json()["metadata"]["note"] == NUL
        fixed = http.patch("/threads/t", json={"metadata": {"note": "a b"}})
        assert fixed.status_code == 200, fixed.text
        again = http.post("/threads/t/runs", json={"assistant_id": "echo", "input": {}})
        assert again.status_code == 200, again.text
        drain(app)
        [checkpoint] = http.post("/threads/t/history", json={"limit": 1}).json()
        assert checkpoint["metadata"]["note"] == "a b"
        http.close()


def test_a_thread_copy_with_a_body_that_is_not_an_object_is_422(svc: Service) -> None:
    """The SDK sends no body; a body of another shape (or not JSON) was ignored and the
    thread copied all the same, whatever the client meant by it."""
    svc.http.post("/threads", json={"thread_id": "t-c", "graph_id": WORKFLOW})
    before = counts(svc)
    headers = {"Content-Type": "application/json"}
    for body in [b"{nope", b"[1]", b'"t-c"']:
        answer = svc.http.post("/threads/t-c/copy", content=body, headers=headers)
        assert (answer.status_code, answer.json()["error"]) == (422, "invalid_request"), body
    assert counts(svc) == before
    for body in [b"", b"{}"]:
        assert svc.http.post("/threads/t-c/copy", content=body, headers=headers).is_success
    assert counts(svc)[0] == before[0] + 2
