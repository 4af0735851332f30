"""Helpers of the HTTP tests: tokens, a client bound to one live server, raw requests, and a
`serve()` subprocess."""

from __future__ import annotations

import http.client
import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

import keel
from keel.testing.postgres import drop_database
from tests.support import REPO
from tests.support.apps.service import WORKFLOW

# Strong enough for keel.service.auth (at least 128 bits): made with secrets.token_urlsafe(32).
ADMIN = "admin-E253T2dXVUV4gbNBGwWhvYiJqGeIM-Rntoq4CieKW8U"
READER = "reader-La4sjL2sSEt5pVO6wi548jpSZ_OaMqHIvHTben9GTMY"
RUNS_WRITER = "writer-zyZ7LiC-oVu0ibza0-qh72unTurM59cR0MHXTVZURvQ"
APPROVER = "approver-IKFmN7p8GIcP-PBL5-p0sIGk5DItZtFjMEoo9kkQego"
TOKENS = {
    ADMIN: ["*"],
    READER: ["runs:read", "approvals:read"],
    RUNS_WRITER: ["runs:write"],
    APPROVER: ["approvals:read", "approvals:write"],
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Service:
    """One App behind one live server; `http` carries the admin token."""

    app: keel.App
    url: str
    clients: list[httpx.Client] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.http = self.as_(ADMIN)

    def as_(self, token: str | None, **options: Any) -> httpx.Client:
        headers = bearer(token) if token else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=60, **options)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def submit(self, job_id: str, topic: str = "ai", **extra: Any) -> httpx.Response:
        body = {"workflow": WORKFLOW, "job_id": job_id, "input": {"topic": topic, **extra}}
        return self.http.post("/v1/runs", json=body)

    def work(self) -> None:
        self.app.run_worker(stop_when_idle=True, handle_signals=False)

    def waiting_run(self, job_id: str, **extra: Any) -> tuple[str, str]:
        """Admit a run and drive it to its approval; return (run_id, approval_id)."""
        run_id = self.submit(job_id, **extra).json()["run_id"]
        self.work()
        run = self.http.get(f"/v1/runs/{run_id}").json()
        assert run["status"] == "waiting", run
        (wait,) = run["waits"]
        return run_id, wait["approval_id"]

    def events(self, run_id: str, kind: str) -> list[dict[str, Any]]:
        timeline = self.http.get(f"/v1/runs/{run_id}").json()["timeline"]
        return [e for e in timeline if e["kind"] == kind]

    def raw_get(self, path: str) -> tuple[int, str]:
        """GET `path` exactly as written (httpx would resolve `..` segments before sending)."""
        url = httpx.URL(self.url)
        conn = http.client.HTTPConnection(url.host, url.port, timeout=30)
        try:
            conn.request("GET", path, headers=bearer(ADMIN))
            answer = conn.getresponse()
            return answer.status, answer.read().decode(errors="replace")
        finally:
            conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_serve(
    db_url: str, artifacts: Path, **extra_env: str
) -> tuple[subprocess.Popen[str], str]:
    """`keel.service.serve()` in a subprocess, on tests/support/apps/service.py's App; wait until
    it answers. A free port is picked, then released for the server to bind: another process
    may take it in between, so a server that could not bind is started again on another."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        KEEL_DATABASE_URL=db_url, KEEL_ARTIFACTS_DIR=str(artifacts), KEEL_API_TOKENS=f"{ADMIN}=*"
    )
    env.update(extra_env)
    for _ in range(BIND_ATTEMPTS - 1):
        try:
            return _serve_on(free_port(), env)
        except PortTaken:
            continue
    return _serve_on(free_port(), env)


BIND_ATTEMPTS = 3


class PortTaken(AssertionError):
    """The server exited because another process bound its port first."""


def _serve_on(port: int, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    code = (
        "from keel.service import serve; "
        f"serve('tests.support.apps.service:app', port={port}, log_level='warning')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate(timeout=10)
            if "address already in use" in err.lower():
                raise PortTaken(f"port {port} was taken: {err}")
            raise AssertionError(f"serve() did not start: {err}")
        time.sleep(0.05)


@contextmanager
def empty_database(backend: str, db_url: str, tmp_path: Path) -> Iterator[str]:
    """An existing database with no Keel tables: an empty SQLite file, or an empty PG database."""
    if backend == "sqlite":
        path = tmp_path / "empty" / "keel.db"
        path.parent.mkdir()
        sqlite3.connect(path).close()
        yield f"sqlite:///{path}"
        return
    name = f"keel_http_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{db_url.rpartition('/')[0]}/{name}"
    finally:
        drop_database(db_url, name)
