"""The HTTP service, on both backends: a real uvicorn server on 127.0.0.1 driven with httpx.

Runs are executed by an in-process worker between requests (`run_worker(stop_when_idle=True)`),
never by the server: a request only records and wakes. The workflow is
tests/support/apps/service.py; the `serve` and `svc` fixtures are in conftest.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph.graph import END, START, StateGraph

import keel
from keel.service import create_app, health
from tests.support.apps import versions
from tests.support.apps.service import PERFORMED, WORKFLOW, LiveServer, register
from tests.support.graphs import EchoState
from tests.support.in_doubt import in_doubt
from tests.support.providers import Provider
from tests.support.service_client import (
    ADMIN,
    APPROVER,
    READER,
    TOKENS,
    Service,
    bearer,
    empty_database,
    start_serve,
)
from tests.support.workers import drain

# -- health ---------------------------------------------------------------------------------


def test_healthz_and_readyz_need_no_token(svc: Service) -> None:
    anonymous = svc.as_(None)
    assert anonymous.get("/healthz").json() == {"status": "ok"}
    ready = anonymous.get("/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ready"
    assert body["schema_version"] == body["expected_schema_version"] >= 3
    assert body["database"] in ("sqlite", "postgres")
    assert anonymous.get("/openapi.json").json()["paths"]["/v1/approvals/{approval_id}/decision"]


@pytest.fixture
def unmigrated_url(backend: str, db_url: str, tmp_path: Path) -> Iterator[str]:
    with empty_database(backend, db_url, tmp_path) as url:
        yield url


def test_readyz_is_503_until_the_database_is_migrated(unmigrated_url: str, tmp_path: Path) -> None:
    app = keel.App(unmigrated_url, artifacts_dir=tmp_path / "artifacts")
    try:
        with (
            LiveServer(create_app(app, tokens=TOKENS)) as server,
            httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=30) as http,
        ):
            not_ready = http.get("/readyz")
            assert not_ready.status_code == 503
            assert not_ready.json()["status"] == "unavailable"
            assert "keel migrate" in not_ready.json()["reason"]
            assert not_ready.json()["schema_version"] == 0
            # Keel's own endpoints say the same, as a 503 rather than a crash.
            listed = http.get("/v1/runs")
            assert (listed.status_code, listed.json()["error"]) == (503, "schema_mismatch")
            app.migrate()
            assert http.get("/readyz").status_code == 200
            assert http.get("/v1/runs").json()["runs"] == []
    finally:
        app.close()


def test_readyz_does_not_create_a_missing_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "keel.db"
    app = keel.App(f"sqlite:///{path}", artifacts_dir=tmp_path / "artifacts")
    try:
        with LiveServer(create_app(app, tokens=TOKENS)) as server:
            answer = httpx.get(f"{server.url}/readyz", timeout=30)
        assert answer.status_code == 503
        assert "no database file" in answer.json()["reason"]
        assert not path.exists()
    finally:
        app.close()


def test_readyz_on_an_unreachable_database_is_503_and_leaks_no_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "READY_TIMEOUT", 0.5)
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        url = f"postgresql://keel:keel@127.0.0.1:{s.getsockname()[1]}/keel"
        app = keel.App(url, artifacts_dir=tmp_path / "artifacts")
        try:
            with LiveServer(create_app(app, tokens=TOKENS)) as server:
                for _ in range(3):
                    answer = httpx.get(f"{server.url}/readyz", timeout=30)
                    assert answer.status_code == 503
                    assert "did not answer within 0.5 s" in answer.json()["reason"]

            async def pool_tasks() -> list[str]:
                await asyncio.sleep(0.2)  # let cancelled pools finish closing
                return [t.get_name() for t in asyncio.all_tasks() if "pool" in t.get_name()]

            # Every probe that gave up closed the pool it had started opening.
            assert app.aio.runtime.portal.call(pool_tasks()) == []
        finally:
            app.close()


# -- auth -----------------------------------------------------------------------------------


def test_every_endpoint_but_health_needs_a_token_with_its_scope(svc: Service) -> None:
    run_id, approval_id = svc.waiting_run("auth-1")
    endpoints: list[tuple[str, str, dict[str, Any] | None, str]] = [
        ("POST", "/v1/runs", {"workflow": WORKFLOW, "job_id": "x", "input": {}}, "runs:write"),
        ("GET", "/v1/runs", None, "runs:read"),
        ("GET", f"/v1/runs/{run_id}", None, "runs:read"),
        ("GET", f"/v1/runs/{run_id}/artifacts/draft.md", None, "runs:read"),
        ("POST", f"/v1/runs/{run_id}/cancel", None, "runs:write"),
        ("POST", f"/v1/runs/{run_id}/resume", None, "runs:write"),
        ("GET", "/v1/approvals", None, "approvals:read"),
        ("GET", f"/v1/approvals/{approval_id}", None, "approvals:read"),
        (
            "POST",
            f"/v1/approvals/{approval_id}/decision",
            {"decision": "approve"},
            "approvals:write",
        ),
    ]
    holders = {
        scope: {t for t, scopes in TOKENS.items() if scope in scopes or "*" in scopes}
        for _, _, _, scope in endpoints
    }
    anonymous = svc.as_(None)
    for method, path, body, scope in endpoints:
        for token, headers in (
            (None, {}),
            ("unknown", bearer("not-a-token")),
            ("basic", {"Authorization": "Basic YWRtaW46YWRtaW4="}),
        ):
            answer = anonymous.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, (method, path, token, answer.text)
            assert answer.headers["WWW-Authenticate"] == "Bearer"
            assert answer.json()["error"] == "unauthenticated"
        for token in set(TOKENS) - holders[scope]:
            answer = anonymous.request(method, path, json=body, headers=bearer(token))
            assert answer.status_code == 403, (method, path, token, answer.text)
            assert scope in answer.json()["message"]
    # Nothing the refused requests asked for happened.
    details = svc.http.get(f"/v1/runs/{run_id}").json()
    assert details["status"] == "waiting"
    assert details["waits"][0]["status"] == "pending"
    assert svc.http.get("/v1/runs", params={"job_id": "x"}).json()["runs"] == []
    # A token with the scope gets through.
    reader = svc.as_(READER)
    assert reader.get(f"/v1/runs/{run_id}").status_code == 200
    approver = svc.as_(APPROVER)
    decided = approver.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"})
    assert decided.status_code == 200, decided.text
    # Without `by`, the token's fingerprint decides, never the token itself.
    assert decided.json()["decided_by"].startswith("token:")
    assert APPROVER not in decided.text


def test_tokens_come_from_the_environment(
    make_app: Callable[..., keel.App], monkeypatch: pytest.MonkeyPatch
) -> None:
    env_reader = "reader-xh1svJ4YrT8fnHBQdDGhN2ZH42HRNOI6F9mzWBdaMp8"
    env_admin = "admin-ziVIOMbzp3hePVUZGRd-zegxOQ2TgLviuIUDStfeM6g"
    monkeypatch.setenv("KEEL_API_TOKENS", f"{env_reader}=runs:read ; {env_admin}=*")
    app = register(make_app())
    with LiveServer(create_app(app)) as server:
        assert httpx.get(f"{server.url}/v1/runs", headers=bearer(env_reader)).status_code == 200
        body = {"workflow": WORKFLOW, "job_id": "env-1", "input": {"topic": "t"}}
        refused = httpx.post(f"{server.url}/v1/runs", json=body, headers=bearer(env_reader))
        assert refused.status_code == 403
        admitted = httpx.post(f"{server.url}/v1/runs", json=body, headers=bearer(env_admin))
        assert admitted.status_code == 201
        assert httpx.get(f"{server.url}/v1/runs", headers=bearer(ADMIN)).status_code == 401
    monkeypatch.setenv("KEEL_API_TOKENS", "tok=runs:reed")
    with pytest.raises(keel.KeelError, match="runs:reed"):
        create_app(app)


def test_without_tokens_everything_but_health_is_closed(serve: Callable[..., Service]) -> None:
    svc = serve(tokens={})
    assert svc.http.get("/v1/runs").status_code == 401
    assert svc.http.get("/healthz").status_code == 200


# -- runs -----------------------------------------------------------------------------------


def test_submit_is_idempotent_201_then_200(svc: Service) -> None:
    first = svc.submit("ticket-1")
    assert first.status_code == 201, first.text
    run = first.json()
    assert (run["status"], run["decision"], run["job_id"]) == ("queued", "not_decided", "ticket-1")
    assert first.headers["Location"] == run["url"]
    again = svc.submit("ticket-1")
    assert again.status_code == 200
    assert again.json()["run_id"] == run["run_id"]
    body = {"workflow": WORKFLOW, "job_id": "ticket-1", "input": {"topic": "different"}}
    other_input = svc.http.post("/v1/runs", json={**body, "if_exists": "new"})
    assert other_input.status_code == 201
    assert other_input.json()["run_id"] != run["run_id"]
    body = {"workflow": WORKFLOW, "job_id": "ticket-1", "input": {"topic": "ai"}, "rerun": True}
    rerun = svc.http.post("/v1/runs", json=body)
    assert rerun.status_code == 201
    assert rerun.json()["attempt"] == 2
    assert len(svc.http.get("/v1/runs", params={"job_id": "ticket-1"}).json()["runs"]) == 3


def test_submit_refuses_bad_bodies(serve: Callable[..., Service]) -> None:
    svc = serve({"max_input_bytes": 500}, max_body_bytes=2048)
    ok = {"workflow": WORKFLOW, "job_id": "a", "input": {}}
    cases: list[tuple[Any, int, str, str]] = [
        ({"workflow": WORKFLOW, "input": {}}, 422, "invalid_request", "body.job_id: Field req"),
        ({**ok, "priority": 1}, 422, "invalid_request", "body.priority: Extra inputs are not"),
        ({**ok, "workflow": "nope"}, 422, "unknown_workflow", "'nope'"),
        ({**ok, "job_id": "Bad Id!"}, 400, "invalid_id", "job_id"),
        ({**ok, "input": {"t": "x" * 1000}}, 413, "input_too_large", "limit is 500"),
        ({**ok, "input": {"t": "x" * 3000}}, 413, "body_too_large", "2048 bytes"),
    ]
    for body, status, code, text in cases:
        answer = svc.http.post("/v1/runs", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["error"] == code
        assert text in answer.json()["message"]
    not_json = svc.http.post("/v1/runs", content=b"{not json", headers={"Content-Type": "a/json"})
    assert not_json.status_code == 415
    not_json = svc.http.post(
        "/v1/runs", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 422
    assert "JSON" in not_json.json()["message"]
    assert svc.http.get("/v1/runs").json()["runs"] == []


def test_streamed_body_over_the_limit_is_413_without_content_length(
    serve: Callable[..., Service],
) -> None:
    svc = serve(max_body_bytes=1024)
    payload = b'{"workflow": "review", "job_id": "big", "input": {"t": "' + b"x" * 1500 + b'"}}'

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(payload), 500):
            yield payload[i : i + 500]

    answer = svc.http.post(
        "/v1/runs", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert "content-length" not in answer.request.headers
    assert answer.request.headers["transfer-encoding"] == "chunked"
    assert answer.status_code == 413
    small = b'{"workflow": "review", "job_id": "small", "input": {"topic": "t"}}'
    streamed_ok = svc.http.post(
        "/v1/runs",
        content=iter([small[:20], small[20:]]),
        headers={"Content-Type": "application/json"},
    )
    assert streamed_ok.status_code == 201, streamed_ok.text
    assert [r["job_id"] for r in svc.http.get("/v1/runs").json()["runs"]] == ["small"]


def test_a_body_far_over_the_limit_still_hears_its_413(serve: Callable[..., Service]) -> None:
    # Refused after 2 KB: the rest of the body is read and dropped before the 413 goes out.
    # Closed unread, the connection was reset, and a client that reads its answer after the
    # reset arrived (a busy machine; here, a pause) saw "connection reset" instead of why.
    svc = serve(max_body_bytes=2048)
    host, port = svc.url.removeprefix("http://").split(":")
    body = json.dumps({"workflow": WORKFLOW, "job_id": "big", "input": {"t": "x" * 200_000}})
    request = (
        f"POST /v1/runs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {ADMIN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        time.sleep(0.5)  # the server answered and closed meanwhile
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"body_too_large" in answer
    assert svc.http.get("/v1/runs").json()["runs"] == []


def test_list_runs_filters_and_pages(svc: Service) -> None:
    made = [svc.submit(f"job-{i}", topic=f"t{i}").json()["run_id"] for i in range(5)]
    other = svc.http.post(
        "/v1/runs", json={"workflow": "other", "job_id": "job-x", "input": {"topic": "x"}}
    ).json()["run_id"]
    seen: list[str] = []
    offset: int | None = 0
    pages = 0
    while offset is not None:
        page = svc.http.get("/v1/runs", params={"limit": 2, "offset": offset}).json()
        assert len(page["runs"]) <= 2
        seen += [r["run_id"] for r in page["runs"]]
        offset = page["next_offset"]
        pages += 1
    assert pages == 3
    assert sorted(seen) == sorted([*made, other])
    only = svc.http.get("/v1/runs", params={"workflow": "other"}).json()["runs"]
    assert [r["run_id"] for r in only] == [other]
    assert [
        r["run_id"] for r in svc.http.get("/v1/runs", params={"job_id": "job-3"}).json()["runs"]
    ] == [made[3]]
    assert len(svc.http.get("/v1/runs", params={"status": "queued"}).json()["runs"]) == 6
    assert svc.http.get("/v1/runs", params={"status": "waiting"}).json()["runs"] == []
    svc.work()
    assert len(svc.http.get("/v1/runs", params={"status": "waiting"}).json()["runs"]) == 6
    for bad in ({"status": "sleeping"}, {"limit": 0}, {"limit": 501}, {"offset": -1}):
        answer = svc.http.get("/v1/runs", params=bad)
        assert answer.status_code == 422, bad
        assert answer.json()["message"].startswith("query.")


def test_a_nul_in_the_path_or_query_string_is_400_on_every_route(svc: Service) -> None:
    # No id, filter or name may hold one: PostgreSQL's text cannot (its DataError was a 500).
    run_id = svc.submit("nul-1", topic="t").json()["run_id"]
    for url in (
        "/v1/runs?job_id=a%00b",
        "/v1/runs?workflow=a%00b",
        "/v1/schedules?workflow=a%00b",
        "/v1/effects?run_id=a%00b",
        "/v1/approvals?run_id=a%00b",
        f"/v1/runs/{run_id}%00",
        f"/v1/runs/{run_id}/events?after=1%00",
        "/threads/a%00b",
        "/ui/runs?job=a%00b",
    ):
        answer = svc.http.get(url)
        assert answer.status_code == 400, (url, answer.text)
        assert answer.json()["error"] == "bad_request", url
        assert "NUL" in answer.json()["message"]
    # Nothing else changes: the run, its events and its console page still answer.
    assert svc.http.get(f"/v1/runs/{run_id}").status_code == 200
    assert svc.http.get("/v1/runs", params={"job_id": "nul-1"}).json()["runs"][0]["run_id"] == (
        run_id
    )


def test_run_details_and_artifact_download(svc: Service, tmp_path: Path) -> None:
    run_id, approval_id = svc.waiting_run("details-1", topic="rust")
    run = svc.http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["decision"], run["termination_reason"]) == (
        "waiting",
        "not_decided",
        None,
    )
    assert run["input"] == {"topic": "rust"}
    kinds = [e["kind"] for e in run["timeline"]]
    assert kinds[0] == "admitted"
    assert "wait.registered" in kinds
    assert run["waits"][0]["payload"] == {"topic": "rust"}
    assert run["waits"][0]["status"] == "pending"
    (artifact,) = run["artifacts"]
    expected = "# rust\n\nA draft about rust.\n"
    assert (artifact["name"], artifact["size"]) == ("draft.md", len(expected))
    # The API's download and the console's (a browser's session) answer alike.
    browser = svc.as_(None)
    browser.get("/ui/login")
    nonce = browser.cookies["keel_login_csrf"]
    browser.post("/ui/login", data={"token": ADMIN, "csrf": nonce})
    console = f"/ui/runs/{run_id}/artifacts/draft.md"
    for client, url in [(svc.http, artifact["download_url"]), (browser, console)]:
        download = client.get(url)
        assert download.status_code == 200, url
        assert download.text == expected
        assert 'filename="draft.md"' in download.headers["content-disposition"]
        part = client.get(url, headers={"Range": "bytes=2-5"})
        assert (part.status_code, part.text) == (206, expected[2:6])
        # A malformed range is 400 and one past the end 416 (with the size, as RFC 9110
        # says), each with the JSON error body (Starlette's plain text, the 416 empty).
        for bad in ("bytes=abc", "bytes=5-2", "items=0-1"):
            refused = client.get(url, headers={"Range": bad})
            assert refused.status_code == 400, (url, bad, refused.text)
            assert refused.json()["error"] == "invalid_range", (url, bad)
        past = client.get(url, headers={"Range": "bytes=999999-"})
        assert (past.status_code, past.json()["error"]) == (416, "range_not_satisfiable"), url
        assert past.headers["content-range"] == f"bytes */{len(expected)}"

    # Files next to and above the run's folder must never be served.
    root = tmp_path / "artifacts"
    (root / "secret.txt").write_text("ROOT-CONTENT")
    (tmp_path / "outside.txt").write_text("OUTSIDE-CONTENT")
    (root / run_id / ".hidden").write_text("HIDDEN-CONTENT")
    folder = root / run_id
    (folder / "link.txt").symlink_to(tmp_path / "outside.txt")
    base = f"/v1/runs/{run_id}/artifacts/"
    for name in (
        "..",
        "%2e%2e",
        "..%2Fsecret.txt",
        "%2E%2E%2F%2E%2E%2Foutside.txt",
        "..%5Csecret.txt",
        ".hidden",
        "link.txt",
        "secret.txt",
        "draft.md%00",
        "draft%20md",
    ):
        status, text = svc.raw_get(base + name)
        assert status in (400, 404), (name, status, text)
        assert "-CONTENT" not in text, name
    missing = svc.http.get(f"/v1/runs/{run_id}/artifacts/report.json")
    assert (missing.status_code, missing.json()["error"]) == (404, "artifact_not_found")
    no_run = svc.http.get("/v1/runs/no-such-run/artifacts/draft.md")
    assert (no_run.status_code, no_run.json()["error"]) == (404, "run_not_found")
    assert svc.http.get("/v1/runs/no-such-run").status_code == 404
    malformed = svc.http.get("/v1/runs/Not_A_Run!")
    assert (malformed.status_code, malformed.json()["error"]) == (400, "invalid_id")
    assert svc.http.get(f"/v1/approvals/{approval_id}").json()["status"] == "pending"


# -- approvals ------------------------------------------------------------------------------


def test_approve_through_http_then_the_worker_finishes(svc: Service) -> None:
    run_id, approval_id = svc.waiting_run("approve-1")
    listed = svc.http.get("/v1/approvals").json()["approvals"]
    assert [a["approval_id"] for a in listed] == [approval_id]
    assert listed[0]["run_url"].endswith(f"/v1/runs/{run_id}")
    assert svc.http.get("/v1/approvals", params={"kind": "effect"}).json()["approvals"] == []
    assert len(svc.http.get("/v1/approvals", params={"kind": "all"}).json()["approvals"]) == 1
    assert svc.http.get("/v1/approvals", params={"status": "decided"}).status_code == 422
    # An approval takes no effect resolution: refused, with the wait, and nothing recorded.
    wrong = svc.http.post(f"/v1/approvals/{approval_id}/resolution", json={"performed": True})
    assert (wrong.status_code, wrong.json()["error"]) == (409, "wrong_kind")
    assert wrong.json()["message"].endswith(f"decide it at /v1/approvals/{approval_id}/decision")
    assert wrong.json()["approval"]["status"] == "pending"

    body = {"decision": "approve", "comment": "ship it", "by": "alice"}
    first = svc.http.post(
        f"/v1/approvals/{approval_id}/decision", json=body, headers={"Idempotency-Key": "click-1"}
    )
    assert first.status_code == 200, first.text
    assert first.json()["recorded"] is True
    assert (first.json()["decision"], first.json()["decided_by"]) == ("approved", "alice")
    assert (first.json()["channel"], first.json()["action_id"]) == ("http", "click-1")
    assert first.json()["comment"] == "ship it"
    # The same click again, and a second approver approving too: told what was recorded.
    retry = svc.http.post(
        f"/v1/approvals/{approval_id}/decision", json=body, headers={"Idempotency-Key": "click-1"}
    )
    same = svc.http.post(
        f"/v1/approvals/{approval_id}/decision",
        json={"decision": "approve", "by": "carol", "action_id": "click-3"},
    )
    for answer in (retry, same):
        assert answer.status_code == 200
        payload = answer.json()
        assert payload["recorded"] is False
        assert {k: v for k, v in payload.items() if k != "recorded"} == {
            k: v for k, v in first.json().items() if k != "recorded"
        }
    # A second approver rejecting is refused, as in the CLI: 409, with what was recorded.
    late = svc.http.post(
        f"/v1/approvals/{approval_id}/decision",
        json={"decision": "reject", "by": "bob", "action_id": "click-2"},
    )
    assert (late.status_code, late.json()["error"]) == (409, "decision_conflict"), late.text
    assert late.json()["message"].startswith("not rejected: ")
    assert "already approved by alice" in late.json()["message"]
    assert late.json()["approval"] == {k: v for k, v in first.json().items() if k != "recorded"}
    assert svc.http.get("/v1/approvals").json()["approvals"] == []
    assert svc.http.get(f"/v1/runs/{run_id}").json()["status"] == "queued"
    assert len(PERFORMED) == 0  # the request recorded; it did not run the graph
    svc.work()
    run = svc.http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["decision"], run["termination_reason"]) == (
        "completed",
        "approved",
        "approved",
    )
    assert [p["decision"] for p in PERFORMED] == ["approved"]
    assert [(e["name"], e["status"]) for e in run["effects"]] == [("notify_requester", "sent")]


def test_a_decision_on_a_finished_runs_decided_approval_is_409_run_finished(
    svc: Service,
) -> None:
    run_id, approval_id = svc.waiting_run("late-1")
    path = f"/v1/approvals/{approval_id}/decision"
    won = svc.http.post(path, json={"decision": "approve"}, headers={"Idempotency-Key": "k-1"})
    assert won.status_code == 200, won.text
    svc.work()
    assert svc.http.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
    for wanted in ("reject", "approve"):  # documented: 409 run_finished, saying who decided
        late = svc.http.post(path, json={"decision": wanted, "by": "bob"})
        assert (late.status_code, late.json()["error"]) == (409, "run_finished"), late.text
        assert late.json()["approval"]["decision"] == "approved"
        assert "has finished" in late.json()["message"]
        assert f"{approval_id} was already approved by" in late.json()["message"]
    again = svc.http.post(path, json={"decision": "approve"}, headers={"Idempotency-Key": "k-1"})
    assert (again.status_code, again.json()["recorded"]) == (200, False)


def test_a_decision_records_the_calling_token_beside_the_by_it_typed(svc: Service) -> None:
    run_id, approval_id = svc.waiting_run("who-1")
    answer = svc.http.post(
        f"/v1/approvals/{approval_id}/decision", json={"decision": "approve", "by": "alice"}
    )
    assert answer.status_code == 200, answer.text
    token = answer.json()["principal"]
    assert token.startswith("token:") and answer.json()["decided_by"] == "alice"
    assert svc.http.get(f"/v1/approvals/{approval_id}").json()["principal"] == token
    timeline = svc.http.get(f"/v1/runs/{run_id}").json()["timeline"]
    (recorded,) = [e for e in timeline if e["kind"] == "decision.recorded"]
    assert (recorded["data"]["by"], recorded["data"]["principal"]) == ("alice", token)


def test_an_input_the_graph_cannot_take_is_422_with_field_errors(svc: Service) -> None:
    body = {"workflow": WORKFLOW, "job_id": "bad-input", "input": "hello"}
    answer = svc.http.post("/v1/runs", json=body)
    assert (answer.status_code, answer.json()["error"]) == (422, "invalid_input"), answer.text
    assert answer.json()["errors"] == [answer.json()["errors"][0]]
    assert answer.json()["errors"][0].startswith("input: expected an object")
    typo = svc.http.post("/v1/runs", json={**body, "input": {"topik": "ai"}})
    assert typo.status_code == 422
    assert typo.json()["errors"][0].startswith("input.topik: not a field of")
    assert svc.http.get("/v1/runs").json()["runs"] == []


def test_a_job_with_other_input_is_told_and_can_be_refused(svc: Service) -> None:
    first = svc.submit("job-if")
    assert (first.status_code, first.json()["other_runs"]) == (201, [])
    body = {"workflow": WORKFLOW, "job_id": "job-if", "input": {"topic": "other"}}
    refused = svc.http.post("/v1/runs", json={**body, "if_exists": "error"})
    assert (refused.status_code, refused.json()["error"]) == (409, "job_exists"), refused.text
    # In the API's own words, not Python's.
    message = refused.json()["message"]
    assert '"if_exists": "new"' in message and "if_exists='new'" not in message, message
    reused = svc.http.post("/v1/runs", json={**body, "if_exists": "reuse"})
    assert (reused.status_code, reused.json()["run_id"]) == (200, first.json()["run_id"])
    # The job id is an idempotency key by default: a retried webhook gets the job's run.
    retried = svc.http.post("/v1/runs", json=body)
    assert (retried.status_code, retried.json()["run_id"]) == (200, first.json()["run_id"])
    new = svc.http.post("/v1/runs", json={**body, "if_exists": "new"})
    assert new.status_code == 201
    assert new.json()["other_runs"] == [first.json()["run_id"]]


def test_a_body_that_is_not_json_is_415_saying_so(svc: Service) -> None:
    body = '{"workflow": "x", "job_id": "j", "input": {}}'
    for kind in ("text/plain", "application/x-www-form-urlencoded"):
        headers = {"Content-Type": kind}
        answer = svc.http.post("/v1/runs", content=body, headers=headers)
        assert (answer.status_code, answer.json()["error"]) == (415, "unsupported_media_type")
        assert "application/json" in answer.json()["message"]
    assert svc.http.get("/v1/runs").json()["runs"] == []
    # The console's pages post HTML forms: not refused for their type.
    login = svc.http.post("/ui/login", data={"token": "nope"}, follow_redirects=False)
    assert login.status_code != 415


def test_an_in_doubt_effect_is_resolved_over_http_once(
    make_app: Callable[..., keel.App],
) -> None:
    provider = Provider()
    app, run_id = in_doubt(make_app, provider, delivered=True)
    (wait,) = app.get_run(run_id).waits
    with LiveServer(create_app(app, tokens=TOKENS)) as server:
        svc = Service(app, server.url)
        try:
            path = f"/v1/approvals/{wait['wait_id']}/resolution"
            wrong = svc.http.post(
                f"/v1/approvals/{wait['wait_id']}/decision", json={"decision": "approve"}
            )
            assert (wrong.status_code, wrong.json()["error"]) == (409, "wrong_kind")
            answer = svc.http.post(path, json={"performed": True, "result": {"charged": 5}})
            assert answer.status_code == 200, answer.text
            assert (answer.json()["recorded"], answer.json()["decision"]) == (True, "performed")
            assert answer.json()["principal"].startswith("token:")
            again = svc.http.post(path, json={"performed": True, "result": {"charged": 5}})
            assert (again.status_code, again.json()["recorded"]) == (200, False)
            other = svc.http.post(path, json={"performed": False})
            assert (other.status_code, other.json()["error"]) == (409, "decision_conflict")
            assert other.json()["approval"]["decision"] == "performed"
        finally:
            svc.close()
    drain(app)
    done = app.get_run(run_id)
    assert done.status == "completed"
    assert [e["status"] for e in done.effects] == ["confirmed"]
    assert len(provider.calls) == 1, "never sent a second time"


def test_decision_errors(svc: Service) -> None:
    _, approval_id = svc.waiting_run("errors-1")
    path = f"/v1/approvals/{approval_id}/decision"
    for body, text in (
        ({"decision": "maybe"}, "body.decision"),
        ({}, "body.decision: Field required"),
        ({"decision": "approve", "by": "x" * 201}, "body.by"),
    ):
        answer = svc.http.post(path, json=body)
        assert answer.status_code == 422, body
        assert text in answer.json()["message"]
    unknown = svc.http.post(
        "/v1/approvals/w-000000000000000000000000/decision", json={"decision": "approve"}
    )
    assert (unknown.status_code, unknown.json()["error"]) == (404, "approval_not_found")
    malformed = svc.http.post("/v1/approvals/W..X!/decision", json={"decision": "approve"})
    assert (malformed.status_code, malformed.json()["error"]) == (400, "invalid_id")
    assert svc.http.get("/v1/approvals/w-nope").status_code == 404
    assert svc.http.get(f"/v1/approvals/{approval_id}").json()["status"] == "pending"


def test_cancel_then_a_decision_is_409_with_what_was_recorded(svc: Service) -> None:
    queued = svc.submit("cancel-queued").json()["run_id"]
    cancelled = svc.http.post(f"/v1/runs/{queued}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["status"], cancelled.json()["termination_reason"]) == (
        "cancelled",
        "cancelled",
    )
    again = svc.http.post(f"/v1/runs/{queued}/cancel", json={"by": "ops"})
    assert (again.status_code, again.json()["error"]) == (409, "run_finished")
    assert svc.http.post("/v1/runs/no-such-run/cancel").status_code == 404

    run_id, approval_id = svc.waiting_run("cancel-waiting")
    by_ops = svc.http.post(f"/v1/runs/{run_id}/cancel", json={"by": "ops"})
    assert by_ops.json()["status"] == "cancelled"
    assert svc.events(run_id, "status.cancelled")[0]["data"]["by"] == "ops"
    late = svc.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"})
    assert late.status_code == 409, late.text
    assert late.json()["error"] == "run_finished"
    assert late.json()["approval"]["status"] == "expired"
    assert late.json()["approval"]["decision"] == "cancelled"
    assert svc.events(run_id, "decision.recorded") == []
    svc.work()
    assert PERFORMED == []


def test_resume_of_a_failed_run_continues_it_without_a_second_send(svc: Service) -> None:
    sent: list[str] = []
    broken = [True]

    @keel.effect("ping")
    def ping(to: str, *, idempotency_key: str) -> str:
        sent.append(idempotency_key)
        return to

    def send(state: dict[str, Any]) -> dict[str, Any]:
        return {"text": ping(state["text"])}

    def after(state: dict[str, Any]) -> dict[str, Any]:
        if broken[0]:
            raise RuntimeError("downstream rejected it")
        return {"out": "done"}

    def graph() -> StateGraph:
        g = StateGraph(EchoState)
        g.add_node("send", send)
        g.add_node("after", after)
        g.add_edge(START, "send")
        g.add_edge("send", "after")
        g.add_edge("after", END)
        return g

    svc.app.workflow("resumable")(graph)
    run_id = svc.app.submit("resumable", job_id="resume-1", input={"text": "x"}).run_id
    waiting, _ = svc.waiting_run("resume-2")
    svc.work()
    assert svc.http.get(f"/v1/runs/{run_id}").json()["status"] == "failed"
    not_failed = svc.http.post(f"/v1/runs/{waiting}/resume")
    assert not_failed.status_code == 409, not_failed.text
    assert "only a failed run can be resumed" in not_failed.json()["message"]
    assert svc.http.post("/v1/runs/nope-0000000000000000/resume").status_code == 404

    broken[0] = False
    resumed = svc.http.post(f"/v1/runs/{run_id}/resume", json={"by": "ops"})
    assert resumed.status_code == 200, resumed.text
    assert (resumed.json()["status"], resumed.json()["error"]) == ("queued", None)
    assert svc.http.post(f"/v1/runs/{run_id}/resume").status_code == 409  # queued now
    svc.work()
    assert svc.http.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
    assert len(sent) == 1
    assert svc.events(run_id, "status.queued")[-1]["data"]["by"] == "ops"


def test_a_decision_after_the_deadline_policy_is_409(serve: Callable[..., Service]) -> None:
    clock = keel.ManualClock()
    svc = serve({"clock": clock})
    run_id, approval_id = svc.waiting_run("late-1", timeout="1h")
    clock.advance(2 * 3600)

    async def sweep() -> int:
        return await svc.app.aio.runtime.sweep()

    assert svc.app.aio.runtime.portal.call(sweep()) == 1
    late = svc.http.post(f"/v1/approvals/{approval_id}/decision", json={"decision": "approve"})
    assert (late.status_code, late.json()["error"]) == (409, "run_finished")
    assert late.json()["approval"]["decision"] == "rejected"
    assert late.json()["approval"]["channel"] == "deadline"
    svc.work()
    run = svc.http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["decision"]) == ("completed", "rejected")
    assert svc.events(run_id, "decision.recorded") == []
    assert [p["decision"] for p in PERFORMED] == ["rejected"]


def test_hundred_concurrent_decisions_record_one(svc: Service) -> None:
    run_id, approval_id = svc.waiting_run("race-1")
    n = 100
    gate = threading.Barrier(n)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    wanted = {i: "approve" if i % 2 else "reject" for i in range(n)}

    with httpx.Client(base_url=svc.url, headers=bearer(ADMIN), limits=limits, timeout=60) as http:

        def decide(i: int) -> httpx.Response:
            gate.wait()
            return http.post(
                f"/v1/approvals/{approval_id}/decision",
                json={"decision": wanted[i], "by": f"user-{i}"},
                headers={"Idempotency-Key": f"key-{i}"},
            )

        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(decide, range(n)))

    agreed = [i for i, a in enumerate(answers) if a.status_code == 200]
    winners = [i for i in agreed if answers[i].json()["recorded"]]
    assert len(winners) == 1
    (winner,) = winners
    # Those who decided as the winner did are told it (200); the others are refused (409).
    assert agreed == [i for i in range(n) if wanted[i] == wanted[winner]]
    refused = [a.json() for i, a in enumerate(answers) if i not in agreed]
    assert {(a.status_code, a.json()["error"]) for a in answers if a.status_code != 200} == {
        (409, "decision_conflict")
    }
    bodies = [answers[i].json() for i in agreed] + [r["approval"] for r in refused]
    decision = "approved" if wanted[winner] == "approve" else "rejected"
    assert {b["decision"] for b in bodies} == {decision}
    assert {b["decided_by"] for b in bodies} == {f"user-{winner}"}
    assert {b["action_id"] for b in bodies} == {f"key-{winner}"}
    assert {b["decided_at"] for b in bodies} == {answers[winner].json()["decided_at"]}
    recorded = svc.events(run_id, "decision.recorded")
    assert len(recorded) == 1
    assert recorded[0]["data"]["action_id"] == f"key-{winner}"

    svc.work()
    run = svc.http.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["decision"]) == ("completed", decision)
    # Resumed once: one wake-up after the decision, one claim after it.
    decided_at = recorded[0]["event_id"]
    after = [e["kind"] for e in run["timeline"] if e["event_id"] > decided_at]
    assert after.count("lease.claimed") == 1
    requeued = [
        e
        for e in run["timeline"]
        if e["kind"] == "status.queued" and e["data"].get("wait_id") == approval_id
    ]
    assert len(requeued) == 1
    assert [p["decision"] for p in PERFORMED] == [decision]
    assert [e["status"] for e in run["effects"]] == ["sent"]


def test_an_in_doubt_effect_is_listed_but_not_approvable(make_app: Callable[..., keel.App]) -> None:
    provider = Provider()
    app, run_id = in_doubt(make_app, provider, delivered=True)
    with (
        LiveServer(create_app(app, tokens=TOKENS)) as server,
        httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=30) as http,
    ):
        assert http.get("/v1/approvals").json()["approvals"] == []
        (wait,) = http.get("/v1/approvals", params={"kind": "effect"}).json()["approvals"]
        assert (wait["run_id"], wait["name"]) == (run_id, "charge")
        path = f"/v1/approvals/{wait['approval_id']}/decision"
        refused = http.post(path, json={"decision": "approve"})
        assert (refused.status_code, refused.json()["error"]) == (409, "wrong_kind")
        assert refused.json()["approval"]["status"] == "pending"
        assert "in-doubt effect, not an approval" in refused.json()["message"]
        assert http.get(f"/v1/approvals/{wait['approval_id']}").json()["status"] == "pending"
    assert len(provider.calls) == 1


# -- the serve() entry point ----------------------------------------------------------------


def test_serve_runs_uvicorn_until_sigterm(db_url: str, tmp_path: Path) -> None:
    proc, url = start_serve(db_url, tmp_path / "artifacts")
    try:
        admitted = httpx.post(
            f"{url}/v1/runs",
            json={"workflow": WORKFLOW, "job_id": "served-1", "input": {"topic": "t"}},
            headers=bearer(ADMIN),
        )
        assert admitted.status_code == 201, admitted.text
        assert httpx.get(f"{url}/readyz").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    # uvicorn drains, then re-raises the signal it caught (so the exit status says SIGTERM).
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err, err
    if db_url.startswith("sqlite:"):
        # The App was closed on the way out: SQLite folds and removes the WAL on last close.
        assert not Path(db_url.removeprefix("sqlite:///") + "-wal").exists()
    with keel.App(db_url) as reader:
        assert [r["job_id"] for r in reader.list_runs()] == ["served-1"]


def test_slack_actions_only_with_a_signing_secret(make_app: Callable[..., keel.App]) -> None:
    app = register(make_app())
    paths = create_app(app, tokens=TOKENS).openapi()["paths"]
    assert "/v1/runs" in paths
    assert "/slack/actions" not in paths
    try:
        import keel.service.slack  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"keel\.service\.slack"):
            create_app(app, tokens=TOKENS, slack_signing_secret="s3cret")
    else:
        with_slack = create_app(app, tokens=TOKENS, slack_signing_secret="s3cret")
        assert "/slack/actions" in with_slack.openapi()["paths"]


# -- versions -------------------------------------------------------------------------------


def test_a_stranded_run_is_shown_and_upgraded_with_write_scope(make_app: Any) -> None:
    old = versions.register_v1(make_app())
    run_id = old.submit(versions.WORKFLOW, job_id="o-1", input={"order": "o-1"})["run_id"]
    drain(old)
    new = versions.register_new(make_app())
    drain(new)  # a worker of the new deployment announces itself: version 1 is served no more
    with LiveServer(create_app(new, tokens=TOKENS)) as server:
        admin = httpx.Client(base_url=server.url, headers=bearer(ADMIN), timeout=30)
        reader = httpx.Client(base_url=server.url, headers=bearer(READER), timeout=30)
        with admin, reader:
            [listed] = admin.get("/v1/runs").json()["runs"]
            assert (listed["status"], listed["stranded"]) == ("waiting", True)
            assert admin.get(f"/v1/runs/{run_id}").json()["stranded"] is True
            path = f"/v1/runs/{run_id}/upgrade"
            assert reader.post(path, json={"to": "2"}).status_code == 403
            misfit = admin.post(path, json={"to": "3"})
            assert (misfit.status_code, misfit.json()["error"]) == (409, "version_mismatch")
            assert "node 'review' is not in that version" in misfit.json()["message"]
            unknown = admin.post(path, json={"to": "9"})
            assert (unknown.status_code, unknown.json()["error"]) == (422, "unknown_workflow")
            moved = admin.post(path, json={"to": "2", "by": "ops"})
            assert moved.status_code == 200, moved.text
            assert (moved.json()["workflow_version"], moved.json()["stranded"]) == ("2", False)
    new.approve(run_id, by="manager")
    drain(new)
    assert new.get_run(run_id).output["shipped_by"] == "v2"
