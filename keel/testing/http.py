"""A real HTTP server on 127.0.0.1 that records what it received: a webhook or API provider.

Like many payment and messaging APIs it honours an `Idempotency-Key` header: a request with a key
it has seen gets the first response again and is not counted as a new delivery.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


class HttpSink:
    """`with HttpSink() as sink:` serves on 127.0.0.1:<free port>; `sink.url` is its base URL."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[ReceivedRequest] = []
        self.deliveries: list[ReceivedRequest] = []
        self._answers: dict[str, bytes] = {}
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = ReceivedRequest(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                answer = sink._record(request)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> HttpSink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HttpSink:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _record(self, request: ReceivedRequest) -> bytes:
        key = request.headers.get("idempotency-key")
        with self._lock:
            self.requests.append(request)
            if key is not None and key in self._answers:
                return self._answers[key]
            self.deliveries.append(request)
            answer = json.dumps({"ok": True, "delivery": len(self.deliveries)}).encode()
            if key is not None:
                self._answers[key] = answer
            return answer
