"""CORS for browser clients (LangGraph Studio, agent-chat-ui) on a real server (issue 32).

A browser page on another origin may call the API only when the server names that origin
(`create_app(cors_origins=...)`, `keel serve --cors-origin`, $KEEL_CORS_ORIGINS); by default the
API answers no preflight, so only same-origin pages can use it. `keel dev` lets Studio and
agent-chat-ui's development server in unless told otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import keel
from keel.cli.dev import DEV_CORS_ORIGINS, dev_cors_origins
from keel.service.api import CORS_ENV
from tests.support import REPO
from tests.support.checks import wait_until
from tests.support.service_client import ADMIN, Service, free_port

STUDIO = "https://smith.langchain.com"
CHAT_UI = "http://localhost:3000"
STRANGER = "https://evil.example"


def preflight(url: str, origin: str, path: str = "/threads/search") -> httpx.Response:
    """What a browser asks before a cross-origin POST carrying the SDK's token header."""
    return httpx.options(
        url + path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-api-key",
        },
        timeout=30,
    )


def assert_allowed(response: httpx.Response, origin: str) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == origin
    assert "POST" in response.headers["access-control-allow-methods"]
    allowed = response.headers["access-control-allow-headers"].lower()
    assert "x-api-key" in allowed and "content-type" in allowed


def assert_refused(response: httpx.Response) -> None:
    assert "access-control-allow-origin" not in response.headers, response.headers
    assert response.status_code >= 400


def test_named_origins_get_preflights_and_readable_answers_others_do_not(
    serve: Callable[..., Service],
) -> None:
    svc = serve(cors_origins=[STUDIO, CHAT_UI + "/"])  # a pasted trailing slash still matches
    for origin in (STUDIO, CHAT_UI):
        assert_allowed(preflight(svc.url, origin), origin)
    # Keel's own API too: a browser console of another origin may drive /v1.
    assert_allowed(preflight(svc.url, STUDIO, "/v1/runs"), STUDIO)
    assert_refused(preflight(svc.url, STRANGER))

    # The request itself: the page may read the answer, and the run id the JS SDK takes from
    # Content-Location.
    found = httpx.post(
        svc.url + "/assistants/search",
        json={},
        headers={"Origin": STUDIO, "x-api-key": ADMIN},
        timeout=30,
    )
    assert found.status_code == 200, found.text
    assert found.json(), "the served workflows' assistants"
    assert found.headers["access-control-allow-origin"] == STUDIO
    exposed = found.headers["access-control-expose-headers"].lower()
    assert "content-location" in exposed
    # A refusal is readable by the page too (it can tell a missing token from a network error).
    refused = httpx.post(svc.url + "/threads", json={}, headers={"Origin": STUDIO}, timeout=30)
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == STUDIO
    stranger = httpx.post(
        svc.url + "/assistants/search",
        json={},
        headers={"Origin": STRANGER, "x-api-key": ADMIN},
        timeout=30,
    )
    assert "access-control-allow-origin" not in stranger.headers


def test_without_origins_the_api_is_same_origin_only(
    serve: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CORS_ENV, raising=False)
    svc = serve()
    for origin in (STUDIO, CHAT_UI, STRANGER):
        assert_refused(preflight(svc.url, origin))
    answer = httpx.post(
        svc.url + "/assistants/search",
        json={},
        headers={"Origin": STUDIO, "x-api-key": ADMIN},
        timeout=30,
    )
    assert answer.status_code == 200
    assert "access-control-allow-origin" not in answer.headers


def test_origins_come_from_the_environment_comma_separated(
    serve: Callable[..., Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CORS_ENV, f" {CHAT_UI} ,{STUDIO},")
    svc = serve()
    assert_allowed(preflight(svc.url, CHAT_UI), CHAT_UI)
    assert_allowed(preflight(svc.url, STUDIO), STUDIO)
    assert_refused(preflight(svc.url, STRANGER))
    # An explicit list wins over the environment; an empty one means none.
    closed = serve(cors_origins=[])
    assert_refused(preflight(closed.url, CHAT_UI))


def test_keel_dev_lets_studio_and_agent_chat_ui_in_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(CORS_ENV, raising=False)
    assert dev_cors_origins() == list(DEV_CORS_ORIGINS) == [STUDIO, CHAT_UI]
    monkeypatch.setenv(CORS_ENV, "https://my.app")
    assert dev_cors_origins() == ["https://my.app"]


def test_keel_serve_takes_repeated_cors_origin_options(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/keel.db"
    with keel.App(url) as app:
        app.migrate()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(KEEL_DATABASE_URL=url, KEEL_API_TOKENS=f"{ADMIN}=*", PYTHONUNBUFFERED="1")
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "keel", "serve", "tests.support.apps.cli:app"]
    options = ["--port", str(port), "--cors-origin", STUDIO, "--cors-origin", CHAT_UI]
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*command, *options, "--log-level", "warning"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                return httpx.get(base + "/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, "keel serve to answer")
        for origin in (STUDIO, CHAT_UI):
            assert_allowed(preflight(base, origin), origin)
        assert_refused(preflight(base, STRANGER))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    assert "Traceback" not in log.read_text()
