"""Threads over HTTP, on both backends: a real uvicorn server on 127.0.0.1 driven with httpx.

A conversation's turns, its state and history (compared with what the Python API's
`state_json` gives for the same thread), interrupts answered with JSON values, racing answers,
strategies and every refusal: each bad request answers its own code and changes nothing.
Runs are executed by a worker in this process: `drain` between requests, or a live worker for
the endpoints that wait on one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

import keel
from keel.runtime.snapshot_json import state_json
from keel.runtime.worker import Worker
from keel.service import create_app
from tests.support.apps.service import LiveServer
from tests.support.service_client import ADMIN, READER, RUNS_WRITER, TOKENS, Service
from tests.support.thread_graphs import register
from tests.support.workers import drain

Start = Callable[..., Service]


@pytest.fixture
def start(make_app: Callable[..., keel.App]) -> Iterator[Start]:
    """Serve a new App with the thread graphs (tests/support/thread_graphs.py: `chat`, `ask`,
    `review`), App options as keywords."""
    running: list[tuple[LiveServer, Service]] = []

    def serve(**app_options: Any) -> Service:
        app = register(make_app(lease_ttl=5, **app_options))
        server = LiveServer(create_app(app, tokens=TOKENS)).__enter__()
        running.append((server, Service(app, server.url)))
        return running[-1][1]

    yield serve
    for server, service in running:
        service.close()
        server.__exit__(None, None, None)


@pytest.fixture
def svc(start: Start) -> Service:
    return start()


@contextmanager
def live_worker(app: keel.App) -> Iterator[None]:
    """A worker executing runs as they come, for requests that wait on one."""
    worker = Worker(app.aio.runtime, concurrency=2)
    loop = app.aio.runtime.portal.loop
    done = asyncio.run_coroutine_threadsafe(worker.run(), loop)
    try:
        yield
    finally:
        loop.call_soon_threadsafe(worker.stop)
        done.result(timeout=30)


def ok(answer: httpx.Response, status: int = 200) -> Any:
    assert answer.status_code == status, answer.text
    return answer.json() if answer.content else None


def refused(answer: httpx.Response, status: int, error: str) -> dict[str, Any]:
    assert (answer.status_code, answer.json().get("error")) == (status, error), answer.text
    body: dict[str, Any] = answer.json()
    assert body["message"]
    return body


def say(text: str) -> dict[str, Any]:
    return {"input": {"messages": [{"role": "user", "content": text}]}}


def contents(values: dict[str, Any]) -> list[str]:
    return [m["content"] for m in values["messages"]]


def ask_and_wait(svc: Service, thread_id: str, question: str = "color?") -> str:
    """A run of `ask` on a new thread, driven to its interrupt; its id."""
    body = {"workflow": "ask", "input": {"question": question}}
    run = ok(svc.http.post(f"/v1/threads/{thread_id}/runs", json=body), 201)
    drain(svc.app)
    assert ok(svc.http.get(f"/v1/runs/{run['run_id']}/wait", params={"timeout": 0}))["status"] == (
        "waiting"
    )
    return str(run["run_id"])


# -- a conversation -----------------------------------------------------------------------------


def test_a_three_turn_conversation_over_http(svc: Service) -> None:
    http = svc.http
    made = http.post(
        "/v1/threads", json={"thread_id": "conv-1", "workflow": "chat", "metadata": {"u": 1}}
    )
    thread = ok(made, 201)
    assert made.headers["Location"] == thread["url"] == f"{svc.url}/v1/threads/conv-1"
    assert (thread["status"], thread["runs"], thread["metadata"]) == ("idle", 0, {"u": 1})
    runs = []
    with live_worker(svc.app):
        for text in ("hi", "how are you", "bye"):
            admitted = ok(http.post("/v1/threads/conv-1/runs", json=say(text)), 201)
            assert (admitted["thread_id"], admitted["status"]) == ("conv-1", "queued")
            done = ok(http.get(f"/v1/runs/{admitted['run_id']}/wait", params={"timeout": 60}))
            assert done["status"] == "completed"
            assert contents(done["output"])[-1] == f"echo: {text}"
            runs.append(admitted["run_id"])
    assert len(set(runs)) == 3
    listed = ok(http.get("/v1/threads/conv-1/runs"))
    assert [(r["run_id"], r["thread_seq"]) for r in listed] == list(
        zip(runs, [1, 2, 3], strict=True)
    )
    thread = ok(http.get("/v1/threads/conv-1"))
    assert (thread["status"], thread["runs"]) == ("idle", 3)

    state = ok(http.get("/v1/threads/conv-1/state"))
    assert state == state_json(svc.app.get_state("conv-1"))
    assert contents(state["values"]) == [
        "hi",
        "echo: hi",
        "how are you",
        "echo: how are you",
        "bye",
        "echo: bye",
    ]
    assert state["values"]["turns"] == 3 and state["next"] == []
    assert state["metadata"]["keel_run_id"] == runs[-1]

    history = ok(http.get("/v1/threads/conv-1/history", params={"limit": 100}))
    assert history == [state_json(s) for s in svc.app.get_history("conv-1", 100)]
    assert history[0] == state and len(history) > 3
    assert {h["metadata"]["keel_run_id"] for h in history} == set(runs)
    # Pages of history, and a past checkpoint by id, are the same states.
    before = history[1]["checkpoint_id"]
    older = ok(http.get("/v1/threads/conv-1/history", params={"limit": 2, "before": before}))
    assert older == history[2:4]
    past = history[2]["checkpoint_id"]
    assert ok(http.get(f"/v1/threads/conv-1/state/{past}")) == history[2]
    assert ok(http.get("/v1/threads/conv-1/state", params={"checkpoint_id": past})) == history[2]
    assert history[0]["parent_checkpoint_id"] == history[1]["checkpoint_id"]


def test_a_state_update_is_a_run_that_writes_a_checkpoint(svc: Service) -> None:
    http = svc.http
    ok(http.post("/v1/threads/up-1/runs", json={"workflow": "chat", **say("hi")}), 201)
    drain(svc.app)
    with live_worker(svc.app):
        updated = ok(
            http.post(
                "/v1/threads/up-1/state",
                json={"values": {"turns": 10}, "as_node": "reply", "timeout": 60},
            )
        )
    state = ok(http.get("/v1/threads/up-1/state"))
    assert state["values"]["turns"] == 11  # through the reducer, as LangGraph's update_state
    assert updated["checkpoint_id"] == state["checkpoint_id"]
    assert updated["checkpoint"] == state["checkpoint"]
    assert updated["run"]["status"] == "completed"
    assert state["metadata"]["keel_run_id"] == updated["run"]["run_id"]
    assert updated["run"]["thread_seq"] == 2

    # No worker within the timeout: 202 with the run, which a worker executes later.
    pending = http.post("/v1/threads/up-1/state", json={"values": {"turns": 5}, "timeout": 0})
    body = ok(pending, 202)
    assert (body["checkpoint_id"], body["run"]["status"]) == (None, "queued")
    assert pending.headers["Location"].endswith(f"/v1/runs/{body['run']['run_id']}/wait")
    assert ok(http.get("/v1/threads/up-1/state"))["values"]["turns"] == 11  # not yet
    drain(svc.app)
    done = ok(http.get(pending.headers["Location"]))
    assert done["status"] == "completed"
    state = ok(http.get("/v1/threads/up-1/state"))
    assert state["values"]["turns"] == 16
    assert done["output"]["checkpoint_id"] == state["checkpoint_id"]


def test_wait_answers_202_until_the_run_settles(svc: Service) -> None:
    run = ok(svc.http.post("/v1/threads/w-1/runs", json={"workflow": "chat", **say("x")}), 201)
    early = ok(svc.http.get(f"/v1/runs/{run['run_id']}/wait", params={"timeout": 0}), 202)
    assert (early["status"], early["output"]) == ("queued", None)
    drain(svc.app)
    done = ok(svc.http.get(f"/v1/runs/{run['run_id']}/wait", params={"timeout": 0}))
    assert done["status"] == "completed" and contents(done["output"]) == ["x", "echo: x"]


def test_a_job_id_makes_a_turn_idempotent(svc: Service) -> None:
    turn = {"workflow": "chat", "job_id": "turn-1", **say("once")}
    first = svc.http.post("/v1/threads/j-1/runs", json=turn)
    again = svc.http.post("/v1/threads/j-1/runs", json=turn)
    assert ok(again)["run_id"] == ok(first, 201)["run_id"]
    assert "Location" not in again.headers
    other = ok(svc.http.post("/v1/threads/j-1/runs", json={**turn, "job_id": "turn-2"}), 201)
    drain(svc.app)
    runs = ok(svc.http.get("/v1/threads/j-1/runs"))
    assert [r["run_id"] for r in runs] == [ok(first, 201)["run_id"], other["run_id"]]
    assert contents(ok(svc.http.get("/v1/threads/j-1/state"))["values"]) == [
        "once",
        "echo: once",
        "once",
        "echo: once",
    ]


# -- interrupts ---------------------------------------------------------------------------------


def test_an_interrupt_is_answered_with_a_json_object(svc: Service) -> None:
    http = svc.http
    run_id = ask_and_wait(svc, "ask-1")
    assert ok(http.get("/v1/threads/ask-1"))["status"] == "interrupted"
    state = ok(http.get("/v1/threads/ask-1/state"))
    assert state["next"] == ["ask"]
    assert [i["value"] for i in state["interrupts"]] == [{"question": "color?"}]
    assert state["tasks"][0]["interrupts"] == state["interrupts"]

    value = {"color": "teal", "shades": [1, 2], "nested": {"ok": True, "none": None}}
    answer = {"value": value, "by": "alice", "comment": "as asked"}
    answered = ok(http.post("/v1/threads/ask-1/resume", json=answer))
    assert (answered["run_id"], answered["status"]) == (run_id, "queued")
    drain(svc.app)
    final = ok(http.get("/v1/threads/ask-1/state"))["values"]
    assert final["answer"] == value
    assert final["log"] == ["asked color?", "done"]
    done = ok(http.get(f"/v1/runs/{run_id}/wait", params={"timeout": 0}))
    assert (done["status"], done["output"]["answer"]) == ("completed", value)
    (wait,) = ok(http.get(f"/v1/runs/{run_id}"))["waits"]
    assert (wait["kind"], wait["decided_by"], wait["channel"]) == ("interrupt", "alice", "http")
    assert wait["comment"] == "as asked"
    assert wait["principal"].startswith("token:")  # who made the call, beside who it says
    # Nothing waits any more: a late answer is refused and changes nothing.
    refused(http.post("/v1/threads/ask-1/resume", json={"value": "late"}), 409, "no_pending_wait")
    assert ok(http.get("/v1/threads/ask-1/state"))["values"]["answer"] == value


def test_a_run_with_a_resume_command_answers_the_interrupt(svc: Service) -> None:
    run_id = ask_and_wait(svc, "ask-2")
    # `"resume": null` is an answer too (what interrupt() returns), not a missing one.
    answered = ok(svc.http.post("/v1/threads/ask-2/runs", json={"command": {"resume": None}}))
    assert (answered["run_id"], answered["status"]) == (run_id, "queued")
    assert len(ok(svc.http.get("/v1/threads/ask-2/runs"))) == 1  # no new run
    drain(svc.app)
    values = ok(svc.http.get("/v1/threads/ask-2/state"))["values"]
    assert values["answer"] is None and values["log"] == ["asked color?", "done"]


def test_racing_answers_one_wins_the_rest_are_told_what_won(svc: Service) -> None:
    run_id = ask_and_wait(svc, "race-1")

    def answer(n: int) -> httpx.Response:
        return svc.http.post(
            "/v1/threads/race-1/resume",
            json={"value": {"n": n}, "by": f"user-{n}"},
            headers={"Idempotency-Key": f"key-{n}"},
        )

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(answer, range(10)))
    winners = [n for n, a in enumerate(answers) if a.status_code == 200]
    assert len(winners) == 1, [a.text for a in answers]
    (won,) = winners
    for n, lost in enumerate(answers):
        if n == won:
            continue
        body = refused(lost, 409, "decision_conflict")
        assert body["approval"]["value"] == {"n": won}
        assert body["approval"]["decided_by"] == f"user-{won}"
        assert body["approval"]["action_id"] == f"key-{won}"
    # The winner's retry (its own key) is told it was recorded; a loser's is still refused.
    assert ok(answer(won))["run_id"] == run_id
    refused(answer((won + 1) % 10), 409, "decision_conflict")
    drain(svc.app)
    assert ok(svc.http.get("/v1/threads/race-1/state"))["values"]["answer"] == {"n": won}
    waits = ok(svc.http.get(f"/v1/runs/{run_id}"))["waits"]
    assert [(w["status"], w["decided_by"]) for w in waits] == [("decided", f"user-{won}")]


# -- strategies and thread lifecycle --------------------------------------------------------------


def test_strategies_and_deleting_a_busy_thread(svc: Service) -> None:
    http = svc.http
    first = ok(
        http.post("/v1/threads/busy-1/runs", json={"workflow": "ask", "input": {"question": "a"}}),
        201,
    )
    busy = http.post(
        "/v1/threads/busy-1/runs", json={"input": {"question": "b"}, "multitask_strategy": "reject"}
    )
    assert first["run_id"] in refused(busy, 409, "thread_busy")["message"]
    assert len(ok(http.get("/v1/threads/busy-1/runs"))) == 1
    refused(http.delete("/v1/threads/busy-1"), 409, "thread_busy")

    second = ok(
        http.post(
            "/v1/threads/busy-1/runs",
            json={"input": {"question": "c"}, "multitask_strategy": "interrupt"},
        ),
        201,
    )
    stopped = ok(http.get(f"/v1/runs/{first['run_id']}"))
    assert (stopped["status"], stopped["termination_reason"]) == ("cancelled", "interrupted")
    drain(svc.app)
    assert ok(http.get("/v1/threads/busy-1"))["status"] == "interrupted"
    assert ok(http.get("/v1/threads/busy-1/state"))["values"]["question"] == "c"
    refused(http.delete("/v1/threads/busy-1"), 409, "thread_busy")
    ok(http.post(f"/v1/runs/{second['run_id']}/cancel"))
    assert ok(http.delete("/v1/threads/busy-1"), 204) is None
    refused(http.get("/v1/threads/busy-1"), 404, "thread_not_found")
    # Its runs stay on record.
    assert ok(http.get(f"/v1/runs/{second['run_id']}"))["status"] == "cancelled"


def test_threads_are_created_searched_patched_and_copied(svc: Service) -> None:
    http = svc.http
    made = ok(
        http.post(
            "/v1/threads",
            json={"thread_id": "s-1", "workflow": "chat", "metadata": {"user": "ann", "tier": 2}},
        ),
        201,
    )
    again = {"thread_id": "s-1", "workflow": "chat", "metadata": {"user": "zed"}}
    refused(http.post("/v1/threads", json=again), 409, "thread_exists")
    same = ok(http.post("/v1/threads", json={**again, "if_exists": "do_nothing"}))
    assert same == made  # found, not changed
    empty = ok(http.get("/v1/threads/s-1/state"))
    assert (empty["values"], empty["checkpoint_id"], empty["next"]) == ({}, None, [])
    assert ok(http.get("/v1/threads/s-1/history")) == []
    generated = ok(
        http.post("/v1/threads", json={"workflow": "chat", "metadata": {"user": "bob"}}), 201
    )
    assert len(generated["thread_id"]) == 36

    found = ok(http.post("/v1/threads/search", json={"metadata": {"user": "ann"}}))
    assert [t["thread_id"] for t in found["threads"]] == ["s-1"]
    assert found["next_offset"] is None
    first_page = ok(http.post("/v1/threads/search", json={"limit": 1}))
    assert (len(first_page["threads"]), first_page["next_offset"]) == (1, 1)
    second_page = ok(http.post("/v1/threads/search", json={"limit": 1, "offset": 1}))
    assert {first_page["threads"][0]["thread_id"], second_page["threads"][0]["thread_id"]} == {
        "s-1",
        generated["thread_id"],
    }
    assert second_page["next_offset"] is None

    patched = ok(http.patch("/v1/threads/s-1", json={"metadata": {"tier": 3, "vip": True}}))
    assert patched["metadata"] == {"user": "ann", "tier": 3, "vip": True}
    ok(http.post("/v1/threads/s-1/runs", json=say("hello")), 201)
    drain(svc.app)
    idle = ok(http.post("/v1/threads/search", json={"status": "idle", "metadata": {"vip": True}}))
    assert [t["thread_id"] for t in idle["threads"]] == ["s-1"]

    copy = http.post("/v1/threads/s-1/copy", json={"to": "s-copy"})
    assert ok(copy, 201)["metadata"] == patched["metadata"]
    assert copy.headers["Location"].endswith("/v1/threads/s-copy")
    copied = ok(http.get("/v1/threads/s-copy/state"))
    assert contents(copied["values"]) == ["hello", "echo: hello"]
    assert copied["values"] == ok(http.get("/v1/threads/s-1/state"))["values"]
    refused(http.post("/v1/threads/s-1/copy", json={"to": "s-copy"}), 409, "thread_exists")
    assert ok(http.post("/v1/threads/s-1/copy"), 201)["thread_id"] not in ("s-1", "s-copy")


# -- refusals -------------------------------------------------------------------------------------


def test_bad_requests_get_their_codes_and_change_nothing(start: Start) -> None:
    svc = start(max_input_bytes=2000)
    http = svc.http
    ok(http.post("/v1/threads/ok-1/runs", json={"workflow": "chat", **say("hi")}), 201)
    drain(svc.app)

    def snapshot() -> Any:
        threads = ok(http.post("/v1/threads/search", json={"limit": 500}))["threads"]
        return (
            threads,
            ok(http.get("/v1/threads/ok-1/runs")),
            ok(http.get("/v1/threads/ok-1/history")),
        )

    before = snapshot()
    # Malformed ids: 400 invalid_id, wherever they come.
    for bad in ("bad id", "-leading", "x" * 129, "b%C3%A4d", "semi;colon"):
        refused(http.get(f"/v1/threads/{bad}"), 400, "invalid_id")
        refused(
            http.post(f"/v1/threads/{bad}/runs", json={"workflow": "chat", **say("x")}),
            400,
            "invalid_id",
        )
        refused(http.get(f"/v1/threads/{bad}/state"), 400, "invalid_id")
    refused(
        http.post("/v1/threads", json={"thread_id": "no/slash", "workflow": "chat"}),
        400,
        "invalid_id",
    )
    refused(http.post("/v1/threads/ok-1/copy", json={"to": "no spaces"}), 400, "invalid_id")
    refused(http.get("/v1/runs/bad id/wait"), 400, "invalid_id")
    # Unknown threads, runs and checkpoints: 404.
    for method, path, body in [
        ("GET", "/v1/threads/nope", None),
        ("PATCH", "/v1/threads/nope", {"metadata": {}}),
        ("DELETE", "/v1/threads/nope", None),
        ("POST", "/v1/threads/nope/copy", None),
        ("GET", "/v1/threads/nope/state", None),
        ("GET", "/v1/threads/nope/history", None),
        ("GET", "/v1/threads/nope/runs", None),
        ("POST", "/v1/threads/nope/runs", say("x")),
        ("POST", "/v1/threads/nope/resume", {"value": 1}),
        ("POST", "/v1/threads/nope/state", {"values": {"turns": 1}}),
    ]:
        refused(http.request(method, path, json=body), 404, "thread_not_found")
    refused(http.get("/v1/runs/nope-0123456789abcdef/wait"), 404, "run_not_found")
    refused(http.get("/v1/threads/ok-1/state/1f0-no-such"), 404, "checkpoint_not_found")
    # Wrong shapes: 422 invalid_request.
    for method, path, body in [
        ("POST", "/v1/threads", {"workflow": "chat", "metadata": [1, 2]}),
        ("POST", "/v1/threads", {"workflow": "chat", "surprise": 1}),
        ("POST", "/v1/threads", {"thread_id": "x-1"}),
        ("POST", "/v1/threads", {"thread_id": "", "workflow": "chat"}),
        ("POST", "/v1/threads/ok-1/copy", {"to": ""}),
        ("POST", "/v1/threads", {"workflow": "chat", "if_exists": "update"}),
        ("PATCH", "/v1/threads/ok-1", {"metadata": "tier=3"}),
        ("POST", "/v1/threads/search", {"limit": 0}),
        ("POST", "/v1/threads/search", {"status": "sleeping"}),
        ("POST", "/v1/threads/ok-1/runs", {**say("x"), "multitask_strategy": "yolo"}),
        ("POST", "/v1/threads/ok-1/runs", {"command": {"resume": 1, "then": 2}}),
        ("POST", "/v1/threads/ok-1/runs", {"input": {"turns": "many"}, "unknown": 1}),
        ("POST", "/v1/threads/ok-1/resume", {"by": "alice"}),
        ("POST", "/v1/threads/ok-1/resume", {"value": 1, "wait_id": "../w"}),
        ("POST", "/v1/threads/ok-1/state", {"as_node": "reply"}),
        ("POST", "/v1/threads/ok-1/state", {"values": {}, "timeout": 3600}),
    ]:
        refused(http.request(method, path, json=body), 422, "invalid_request")
    refused(http.get("/v1/runs/x/wait", params={"timeout": -1}), 422, "invalid_request")
    refused(http.get("/v1/threads/ok-1/history", params={"limit": 0}), 422, "invalid_request")
    not_json = http.post(
        "/v1/threads/ok-1/runs", content=b'{"input": ', headers={"Content-Type": "application/json"}
    )
    refused(not_json, 422, "invalid_request")
    refused(
        http.post("/v1/threads/ok-1/runs", json={"input": {"turns": "many"}}), 422, "invalid_input"
    )
    refused(http.post("/v1/threads", json={"workflow": "nope"}), 422, "unknown_workflow")
    # A command that both resumes and updates, a thread of another workflow: 400.
    both = {"command": {"resume": 1, "update": {"turns": 1}}}
    refused(http.post("/v1/threads/ok-1/runs", json=both), 400, "bad_request")
    other = {"workflow": "ask", "input": {"question": "q"}}
    refused(http.post("/v1/threads/ok-1/runs", json=other), 400, "bad_request")
    # Too large: the request body (the server's limit), the run's input (the App's).
    refused(http.post("/v1/threads/ok-1/runs", json=say("x" * 70_000)), 413, "body_too_large")
    refused(http.post("/v1/threads/ok-1/runs", json=say("x" * 3000)), 413, "input_too_large")
    # An answer to a thread whose run finished: nothing waits for it.
    refused(http.post("/v1/threads/ok-1/resume", json={"value": 1}), 409, "no_pending_wait")
    refused(
        http.post("/v1/threads/ok-1/runs", json={"command": {"resume": 1}}), 409, "no_pending_wait"
    )

    assert snapshot() == before
    assert ok(http.get("/v1/threads/ok-1/state")) == state_json(svc.app.get_state("ok-1"))


def test_an_approval_is_not_answered_as_a_thread_resume(svc: Service) -> None:
    """A resume value answers plain interrupts only: an approval's wait keeps its own rules."""
    body = {"workflow": "review", "input": {"question": "ship?"}}
    run = ok(svc.http.post("/v1/threads/ap-1/runs", json=body), 201)
    drain(svc.app)
    wrong = svc.http.post("/v1/threads/ap-1/resume", json={"value": "approved"})
    refused(wrong, 409, "wrong_kind")
    (wait,) = ok(svc.http.get(f"/v1/runs/{run['run_id']}"))["waits"]
    assert (wait["status"], wait["decision"]) == ("pending", None)


def test_thread_endpoints_need_their_scope(svc: Service) -> None:
    ok(svc.http.post("/v1/threads", json={"thread_id": "auth-1", "workflow": "chat"}), 201)
    reads = [
        ("GET", "/v1/threads/auth-1", None),
        ("GET", "/v1/threads/auth-1/state", None),
        ("GET", "/v1/threads/auth-1/history", None),
        ("GET", "/v1/threads/auth-1/runs", None),
        ("POST", "/v1/threads/search", {}),
    ]
    writes = [
        ("POST", "/v1/threads", {"workflow": "chat"}),
        ("PATCH", "/v1/threads/auth-1", {"metadata": {"a": 1}}),
        ("DELETE", "/v1/threads/auth-1", None),
        ("POST", "/v1/threads/auth-1/copy", None),
        ("POST", "/v1/threads/auth-1/runs", say("x")),
        ("POST", "/v1/threads/auth-1/resume", {"value": 1}),
        ("POST", "/v1/threads/auth-1/state", {"values": {"turns": 1}, "timeout": 0}),
    ]
    anonymous, reader, writer = svc.as_(None), svc.as_(READER), svc.as_(RUNS_WRITER)
    for method, path, body in reads + writes:
        refused(anonymous.request(method, path, json=body), 401, "unauthenticated")
    for method, path, body in writes:
        assert (
            "runs:write"
            in refused(reader.request(method, path, json=body), 403, "forbidden")["message"]
        )
    for method, path, body in reads:
        refused(writer.request(method, path, json=body), 403, "forbidden")
        ok(reader.request(method, path, json=body))
    # Nothing the refused requests asked for happened.
    thread = ok(svc.as_(ADMIN).get("/v1/threads/auth-1"))
    assert (thread["runs"], thread["metadata"]) == (0, {})
    assert ok(svc.http.post("/v1/threads/search", json={}))["threads"] == [thread]


def test_a_state_update_that_cannot_apply_is_refused(svc: Service) -> None:
    ok(svc.http.post("/v1/threads/up-2/runs", json={"workflow": "chat", **say("hi")}), 201)
    drain(svc.app)
    before = ok(svc.http.get("/v1/threads/up-2/state"))
    wrong = {"values": {"turns": 1}, "as_node": "nosuch", "timeout": 0}
    body = refused(svc.http.post("/v1/threads/up-2/state", json=wrong), 400, "bad_request")
    assert "nosuch" in body["message"]
    assert len(ok(svc.http.get("/v1/threads/up-2/runs"))) == 1  # nothing admitted
    assert ok(svc.http.get("/v1/threads/up-2/state")) == before
    # Values its reducer refuses (int + str): the update's run fails, and says why.
    with live_worker(svc.app):
        bad = {"values": {"turns": "many"}, "as_node": "reply", "timeout": 60}
        failed = refused(
            svc.http.post("/v1/threads/up-2/state", json=bad), 422, "state_update_failed"
        )
    assert "TypeError" in failed["message"]
    (_, update) = ok(svc.http.get("/v1/threads/up-2/runs"))
    assert update["status"] == "failed" and update["run_id"] in failed["message"]
    assert ok(svc.http.get("/v1/threads/up-2/state")) == before


def test_a_state_update_answers_an_interrupted_thread(svc: Service) -> None:
    waiting = ask_and_wait(svc, "up-3")
    with live_worker(svc.app):
        update = {"values": {"answer": "by hand"}, "as_node": "ask", "timeout": 60}
        updated = ok(svc.http.post("/v1/threads/up-3/state", json=update))
    ended = ok(svc.http.get(f"/v1/runs/{waiting}"))
    assert (ended["status"], ended["termination_reason"]) == ("cancelled", "interrupted")
    state = ok(svc.http.get("/v1/threads/up-3/state"))
    assert state["checkpoint_id"] == updated["checkpoint_id"]
    # As if `ask` returned it: the interrupt is gone, the graph would go on at `done`.
    assert (state["values"]["answer"], state["next"], state["interrupts"]) == (
        "by hand",
        ["done"],
        [],
    )
    assert state["values"]["log"] == []
    assert ok(svc.http.get("/v1/threads/up-3"))["status"] == "idle"
