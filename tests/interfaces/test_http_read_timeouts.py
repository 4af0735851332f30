"""`keel serve` cuts off a client that sends its request too slowly (slowloris), and only it."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import keel
from tests.support.service_client import start_serve


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    with keel.App(url) as app:
        app.migrate()
    proc, base = start_serve(
        url, tmp_path / "artifacts", KEEL_HTTP_HEADER_TIMEOUT="1", KEEL_HTTP_BODY_TIMEOUT="1"
    )
    try:
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def connect(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=20)
    return conn


def closed_without_answer(conn: socket.socket) -> bool:
    """Read until the server closes; True if it closed without a byte of response. A server
    that never closes makes recv time out after 20 s (the test fails, it does not hang)."""
    received = b""
    while chunk := conn.recv(4096):
        received += chunk
    return received == b""


def test_headers_that_never_finish_are_cut_off(served: str) -> None:
    with connect(served) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: keel\r\n")  # no blank line, ever
        assert closed_without_answer(conn)


def test_a_connection_that_sends_nothing_is_cut_off(served: str) -> None:
    with connect(served) as conn:
        assert closed_without_answer(conn)


def test_a_body_shorter_than_announced_is_cut_off(served: str) -> None:
    with connect(served) as conn:
        conn.sendall(
            b"POST /v1/runs HTTP/1.1\r\nHost: keel\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"workflow":'
        )
        assert closed_without_answer(conn)


def test_a_prompt_client_is_answered_on_a_kept_alive_connection(served: str) -> None:
    with httpx.Client(base_url=served) as http:
        for _ in range(3):  # one connection, three requests
            assert http.get("/healthz").status_code == 200
    with connect(served) as conn:
        # Headers in pieces, each well within the timeout: answered.
        conn.sendall(b"GET /healthz HTTP/1.1\r\n")
        conn.sendall(b"Host: keel\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
