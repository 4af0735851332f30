"""A completion webhook receiver on 127.0.0.1: records every delivery it is sent (headers by
lower-case name, body, and whether its Standard Webhooks signature verifies), and answers 503
with a Retry-After while told to fail (`fail_for`), or a fixed status (`answer`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from keel.core.webhooks import BadSignature, verify_standard


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes
    valid: bool
    status: int

    @property
    def id(self) -> str:
        return self.headers.get("webhook-id", "")

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    secret: str
    url: str = ""
    answer: int = 200
    retry_after: str = "1"
    failing_until: float = 0.0
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_for(self, seconds: float) -> None:
        self.failing_until = time.monotonic() + seconds

    def accepted(self) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.status == 200]

    def all(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)

    def handle(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str]]:
        try:
            verify_standard(self.secret, headers, body, now=time.time())
            valid = True
        except BadSignature:
            valid = False
        status = self.answer
        extra: dict[str, str] = {}
        if time.monotonic() < self.failing_until:
            status, extra = 503, {"Retry-After": self.retry_after}
        with self.lock:
            self.deliveries.append(Delivery(headers, body, valid, status))
        return status, extra


@contextmanager
def receiving(secret: str) -> Iterator[Receiver]:
    receiver = Receiver(secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, extra = receiver.handle(headers, body)
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
