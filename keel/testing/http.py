"""A real HTTP server on 127.0.0.1 that records what it received: a webhook or API provider.

What it counts as a *delivery* is a request that changes something: POST, PUT, PATCH or DELETE.
Like many payment and messaging APIs it honours an `Idempotency-Key` header: a change with a key
it has already seen gets the first response again and is not counted a second time.

It can also misbehave as providers do: `refuse(503, seconds=10)` answers every change with that
status (not counted, not remembered) for a while, `refuse(500)` until `accept()`; `hold = 2.0`
counts a change and then holds its response that long (a caller killed meanwhile never hears);
`commit_after = 6.0` takes that long before it counts a change at all (a slow provider that
commits at the end of the call, whether or not its caller still waits).

A GET (or HEAD) is a *lookup*, never a delivery: it is how a reconciler asks the provider "did
you receive this?". `GET <path>?field=value&...` answers 200 with
`{"deliveries": [...]}`, the deliveries made to `<path>` whose JSON body has every given field
at the given value (`idempotency_key=...` also matches the Idempotency-Key header); each item is
the delivery's JSON body plus `"delivery": n`, its number. No match is an empty list, not 404:
"I have no such charge" is an answer.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""The methods whose requests count as deliveries."""


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_ns: int = field(default_factory=time.monotonic_ns)
    """When it arrived, on the system-wide monotonic clock (comparable across processes)."""

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    @property
    def route(self) -> str:
        """The path without its query string."""
        return urlsplit(self.path).path

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get("idempotency-key")


class HttpSink:
    """`with HttpSink() as sink:` serves on 127.0.0.1:<free port>; `sink.url` is its base URL.

    `requests` holds every request received, `deliveries` only the counted changes (see the
    module's docstring), both in arrival order.
    """

    def __init__(self, port: int = 0) -> None:
        self.requests: list[ReceivedRequest] = []
        self.deliveries: list[ReceivedRequest] = []
        self._answers: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._refusal: tuple[int, float, float | None] | None = None
        self.refused = 0
        """How many changes were answered with the refusal's status."""
        self.hold = 0.0
        """Seconds to hold the response to a counted change (it is counted before)."""
        self.commit_after = 0.0
        """Seconds a change takes before it is counted and answered: a slow provider that
        commits at the end of the call, whether or not its caller is still waiting."""
        self.arrived = 0
        """Changes received so far, counted on arrival (before `commit_after`)."""
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if len(body) < length:
                    # The caller died before its whole body was sent: a provider never
                    # takes an incomplete request, so neither is it counted here.
                    self.close_connection = True
                    return
                request = ReceivedRequest(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                refusal = sink._refusing(request)
                if refusal is not None:
                    status, retry_after = refusal
                    self.send_response(status)
                    if retry_after is not None:
                        self.send_header("Retry-After", f"{retry_after:g}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if request.method in CHANGES:
                    with sink._lock:
                        sink.arrived += 1
                    if sink.commit_after:
                        time.sleep(sink.commit_after)
                answer = sink._record(request)
                if sink.hold and request.method in CHANGES:
                    time.sleep(sink.hold)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if self.command != "HEAD":
                    try:
                        self.wfile.write(answer)
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the caller died waiting (a held response): it never heard

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

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

    def refuse(
        self, status: int = 503, *, seconds: float | None = None, retry_after: float | None = None
    ) -> None:
        """Answer every change with `status` for `seconds` (None: until `accept()`)."""
        until = time.monotonic() + seconds if seconds is not None else None
        with self._lock:
            self._refusal = (status, until if until is not None else float("inf"), retry_after)

    def accept(self) -> None:
        with self._lock:
            self._refusal = None

    def _refusing(self, request: ReceivedRequest) -> tuple[int, float | None] | None:
        if request.method not in CHANGES:
            return None
        with self._lock:
            if self._refusal is None or time.monotonic() >= self._refusal[1]:
                return None
            self.requests.append(request)
            self.refused += 1
            return self._refusal[0], self._refusal[2]

    def lookup(self, route: str, **match: str) -> list[ReceivedRequest]:
        """The deliveries to `route` matching every field (see the module's docstring)."""
        with self._lock:
            return [d for d in self.deliveries if d.route == route and _matches(d, match)]

    def _record(self, request: ReceivedRequest) -> bytes:
        key = request.idempotency_key
        if request.method not in CHANGES:
            query = dict(parse_qsl(urlsplit(request.path).query))
            with self._lock:
                self.requests.append(request)
                found = [
                    {**_body(d), "delivery": self.deliveries.index(d) + 1}
                    for d in self.deliveries
                    if d.route == request.route and _matches(d, query)
                ]
            return json.dumps({"deliveries": found}).encode()
        with self._lock:
            self.requests.append(request)
            if key is not None and key in self._answers:
                return self._answers[key]
            self.deliveries.append(request)
            answer = json.dumps({"ok": True, "delivery": len(self.deliveries)}).encode()
            if key is not None:
                self._answers[key] = answer
            return answer


def _body(request: ReceivedRequest) -> dict[str, Any]:
    try:
        value = request.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _matches(request: ReceivedRequest, match: dict[str, str]) -> bool:
    body = _body(request)
    for name, want in match.items():
        if name == "idempotency_key" and request.idempotency_key == want:
            continue
        if name not in body or str(body[name]) != want:
            return False
    return True
