"""Keel's own HTTP API lives under /v1 (the root is the LangGraph Agent Server protocol's): its
endpoints answer there with URLs that say so, what is not Keel's API stays at the root, and a
client still calling the old root paths is told where they went. On both backends, through a
real uvicorn server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

import keel
from keel.service import create_app
from keel.service.api import keel_router
from keel.service.auth import Authenticator
from tests.support.apps.service import WORKFLOW
from tests.support.service_client import Service


def ok(answer: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert answer.status_code == status, answer.text
    return answer.json()


def test_every_url_keel_answers_points_under_v1(svc: Service) -> None:
    base = f"{svc.url}/v1"
    admitted = svc.http.post(
        "/v1/runs", json={"workflow": WORKFLOW, "job_id": "v1-1", "input": {"topic": "ai"}}
    )
    run = ok(admitted, 201)
    assert admitted.headers["Location"] == run["url"] == f"{base}/runs/{run['run_id']}"

    run_id, approval_id = svc.waiting_run("v1-2")
    detail = ok(svc.http.get(f"/v1/runs/{run_id}"))
    assert detail["url"] == f"{base}/runs/{run_id}"
    (artifact,) = detail["artifacts"]
    assert artifact["download_url"] == f"{base}/runs/{run_id}/artifacts/draft.md"
    assert svc.http.get(artifact["download_url"]).text.startswith("# ai")
    listed = {a["approval_id"]: a for a in ok(svc.http.get("/v1/approvals"))["approvals"]}
    assert listed[approval_id]["run_url"] == f"{base}/runs/{run_id}"
    assert ok(svc.http.get(f"/v1/approvals/{approval_id}"))["run_url"] == f"{base}/runs/{run_id}"
    assert ok(svc.http.get("/v1/effects"))["items"] == []

    made = svc.http.post("/v1/threads", json={"workflow": WORKFLOW, "thread_id": "v1-t"})
    assert made.headers["Location"] == ok(made, 201)["url"] == f"{base}/threads/v1-t"
    turn = svc.http.post("/v1/threads/v1-t/runs", json={"input": {"topic": "threads"}})
    queued = ok(turn, 201)
    assert turn.headers["Location"] == queued["url"] == f"{base}/runs/{queued['run_id']}"
    waited = svc.http.get(f"/v1/runs/{queued['run_id']}/wait", params={"timeout": 0})
    assert ok(waited, 202)["url"] == queued["url"]


def test_what_is_not_keels_api_stays_at_the_root(svc: Service) -> None:
    anonymous = svc.as_(None)
    for path in (
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/docs",
        "/redoc",
        "/ui/login",
    ):
        assert anonymous.get(path).status_code == 200, path
        assert anonymous.get(f"/v1{path}").status_code == 404, f"/v1{path}"


def test_an_old_root_path_is_told_where_it_moved(svc: Service) -> None:
    run_id, approval_id = svc.waiting_run("moved-1")
    for old in ("/approvals", f"/approvals/{approval_id}", "/effects", f"/runs/{run_id}/summary"):
        answer = svc.http.get(old)
        assert answer.status_code == 404, old
        assert answer.json() == {
            "error": "not_found",
            "message": f"Not Found: Keel's own API moved under /v1 (try /v1{old})",
        }
        assert svc.http.get(f"/v1{old}").status_code == 200, f"/v1{old}"
    # A path that never was Keel's keeps the plain answer; so does the protocol's /threads
    # (Keel's own threads were never released at the root).
    for other in ("/nothing", "/threads/t-1/nothing"):
        assert svc.http.get(other).json() == {"error": "not_found", "message": "Not Found"}


def operations(api: FastAPI) -> dict[tuple[str, str], list[str]]:
    """(method, path) -> tags, from the app's OpenAPI schema."""
    return {
        (method, path): operation.get("tags", [])
        for path, methods in api.openapi()["paths"].items()
        for method, operation in methods.items()
    }


def test_the_schema_lists_keels_operations_under_v1_with_their_tags(tmp_path: Path) -> None:
    keel_app = keel.App(f"sqlite:///{tmp_path}/k.db")
    try:
        alone = FastAPI()
        alone.include_router(keel_router(keel_app, Authenticator({})))
        keels = operations(alone)
        served = operations(create_app(keel_app, tokens={}))
    finally:
        keel_app.close()
    assert len(keels) > 25
    moved = {(method, f"/v1{path}"): tags for (method, path), tags in keels.items()}
    assert {op: tags for op, tags in served.items() if op[1].startswith("/v1/")} == moved
    assert moved[("post", "/v1/runs")] == moved[("get", "/v1/runs/{run_id}/events")] == ["runs"]
    assert moved[("post", "/v1/approvals/{approval_id}/decision")] == ["approvals"]
    assert moved[("get", "/v1/effects")] == ["effects"]
    assert moved[("post", "/v1/threads/{thread_id}/resume")] == ["threads"]
    for path in ("/healthz", "/readyz", "/metrics"):
        assert served[("get", path)] == ["health"], path
