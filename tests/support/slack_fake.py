"""Test helpers for Slack: a Slack Web API stand-in on 127.0.0.1 that records every call, a
real uvicorn server in a thread, request signing as Slack does it, and outbox driving.

`SlackServer` is a real HTTP server speaking the slice of the Web API Keel uses
(chat.postMessage, chat.update, conversations.history, conversations.replies); slack-sdk's
WebClient talks to it through `base_url`. It keeps the channel's messages (with their metadata,
which conversations.history returns only when asked, like Slack) so reconcilers can look
messages up, and it can be told to fail the next calls with 429 or 5xx.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import uvicorn
from slack_sdk import WebClient

import keel
from keel.core import notification_outbox
from keel.runtime.worker import Worker

TOKEN = "xoxb-keel-test"
CHANNEL = "C0KEELTEST"
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@dataclass
class Failure:
    status: int
    retry_after: int | None = None
    commit: bool = False
    """Perform the call, then answer with the error (Slack posted it; the client can't tell)."""


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    status: int


@dataclass
class SlackServer:
    channel: str = CHANNEL
    calls: list[Call] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, list[Failure]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _clock: int = 0

    def start(self) -> SlackServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                server._handle(self)

            do_GET = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> SlackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/api/"

    def client(self) -> WebClient:
        return WebClient(token=TOKEN, base_url=self.base_url, timeout=5)

    def fail(self, method: str, *failures: Failure) -> None:
        with self._lock:
            self.failures.setdefault(method, []).extend(failures)

    def made(self, method: str) -> list[dict[str, Any]]:
        """Parameters of the successful calls to `method`, in order."""
        with self._lock:
            return [c.params for c in self.calls if c.method == method and c.status == 200]

    def top_level(self) -> list[dict[str, Any]]:
        with self._lock:
            return [m for m in self.messages if "thread_ts" not in m]

    def replies(self, ts: str) -> list[dict[str, Any]]:
        with self._lock:
            return [m for m in self.messages if m.get("thread_ts") == ts]

    # -- the API -----------------------------------------------------------------------------

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(req.path)
        method = parts.path.removeprefix("/api/")
        size = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(size) if size else b""
        params: dict[str, Any] = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if "json" in (req.headers.get("Content-Type") or ""):
            params.update(json.loads(raw or b"{}"))
        else:
            params.update({k: v[-1] for k, v in parse_qs(raw.decode()).items()})
        for key in ("blocks", "metadata"):
            if isinstance(params.get(key), str):
                params[key] = json.loads(params[key])
        with self._lock:
            queue = self.failures.get(method) or []
            failure = queue.pop(0) if queue else None
            if req.headers.get("Authorization") != f"Bearer {TOKEN}":
                status, body = 200, {"ok": False, "error": "invalid_auth"}
            elif failure is not None and not failure.commit:
                status, body = failure.status, {"ok": False, "error": "injected"}
            else:
                status, body = 200, self._api(method, params)
                if failure is not None:
                    status, body = failure.status, {"ok": False, "error": "injected"}
            self.calls.append(Call(method, params, status))
        data = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json; charset=utf-8")
        req.send_header("Content-Length", str(len(data)))
        if failure is not None and failure.retry_after is not None:
            req.send_header("Retry-After", str(failure.retry_after))
        req.end_headers()
        req.wfile.write(data)

    def _api(self, method: str, p: dict[str, Any]) -> dict[str, Any]:
        if p.get("channel") not in (None, self.channel):
            return {"ok": False, "error": "channel_not_found"}
        if method == "chat.postMessage":
            self._clock += 1
            msg: dict[str, Any] = {
                "type": "message",
                "user": "UKEELBOT",
                "ts": f"{1_800_000_000 + self._clock}.{self._clock:06d}",
                "text": p.get("text", ""),
            }
            for key in ("blocks", "metadata", "thread_ts"):
                if p.get(key):
                    msg[key] = p[key]
            self.messages.append(msg)
            return {"ok": True, "channel": self.channel, "ts": msg["ts"], "message": msg}
        if method == "chat.update":
            for msg in self.messages:
                if msg["ts"] == p.get("ts"):
                    for key in ("text", "blocks", "metadata"):
                        if key in p:
                            msg[key] = p[key]
                    return {"ok": True, "channel": self.channel, "ts": msg["ts"]}
            return {"ok": False, "error": "message_not_found"}
        if method == "conversations.history":
            found = [m for m in self.messages if "thread_ts" not in m]
            found.sort(key=lambda m: float(m["ts"]), reverse=True)
            inclusive = _truthy(p.get("inclusive"))
            if p.get("latest"):
                top = float(p["latest"])
                found = [
                    m
                    for m in found
                    if float(m["ts"]) < top or (inclusive and m["ts"] == p["latest"])
                ]
            if p.get("oldest"):
                low = float(p["oldest"])
                found = [
                    m
                    for m in found
                    if float(m["ts"]) > low or (inclusive and m["ts"] == p["oldest"])
                ]
            return self._page(found, p)
        if method == "conversations.replies":
            thread = [m for m in self.messages if m["ts"] == p.get("ts")]
            thread += [m for m in self.messages if m.get("thread_ts") == p.get("ts")]
            return self._page(thread, p)
        return {"ok": False, "error": "unknown_method"}

    def _page(self, found: list[dict[str, Any]], p: dict[str, Any]) -> dict[str, Any]:
        start, limit = int(p.get("cursor") or 0), int(p.get("limit") or 100)
        page = found[start : start + limit]
        more = start + limit < len(found)
        if not _truthy(p.get("include_all_metadata")):
            page = [{k: v for k, v in m.items() if k != "metadata"} for m in page]
        return {
            "ok": True,
            "messages": json.loads(json.dumps(page)),
            "has_more": more,
            "response_metadata": {"next_cursor": str(start + limit) if more else ""},
        }


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true")


def meta(msg: dict[str, Any]) -> dict[str, Any]:
    return dict((msg.get("metadata") or {}).get("event_payload") or {})


# -- signing, as Slack does it ---------------------------------------------------------------


def sign(body: bytes, timestamp: int | str, secret: str = SECRET) -> str:
    base = f"v0:{timestamp}:".encode() + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def action_body(
    wait_id: str,
    action_id: str = "keel_approve",
    user: str = "U0EDITOR",
    action_ts: str = "1800000000.000100",
    **extra: Any,
) -> bytes:
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower()},
        "trigger_id": f"trigger-{user}-{action_ts}",
        "actions": [
            {"action_id": action_id, "value": wait_id, "type": "button", "action_ts": action_ts}
        ],
        **extra,
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def signed_headers(body: bytes, timestamp: int, secret: str = SECRET) -> dict[str, str]:
    return {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": str(timestamp),
        "X-Slack-Signature": sign(body, timestamp, secret),
    }


# -- a real uvicorn on 127.0.0.1 ----------------------------------------------------------------


@contextmanager
def uvicorn_server(asgi: Any) -> Iterator[str]:
    """Serve `asgi` with uvicorn in a thread; yield its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(asgi, log_level="warning", lifespan="off", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


# -- driving the outbox and the sweeper in the test process ------------------------------------


def on_app_loop(app: keel.App, make: Callable[[], Any]) -> Any:
    async def go() -> Any:
        await app.aio.open()
        return await make()

    return app.aio.runtime.portal.call(go())


def run_to_idle(app: keel.App) -> None:
    """Run a worker until no run is left to execute. It sweeps and dispatches once, when it
    starts (not again while running, nor before it exits), so tests decide when notifications
    go out."""
    on_app_loop(
        app,
        lambda: Worker(
            app.aio.runtime, stop_when_idle=True, sweep_interval=3600, sweep_before_exit=False
        ).run(),
    )


def deliver(app: keel.App, worker: str = "test-dispatcher") -> int:
    """Deliver every due notification; return how many were settled."""
    return int(on_app_loop(app, lambda: app.aio.runtime.dispatch(worker, limit=100)))


def sweep(app: keel.App) -> int:
    return int(on_app_loop(app, lambda: app.aio.runtime.sweep()))


def claim_and_die(app: keel.App, *notifiers: Any) -> tuple[Any, Any]:
    """A dispatcher claims the next due intent, delivers it (if it is for one of `notifiers`),
    and dies before recording that: the intent stays claimed until its claim expires."""

    async def go() -> Any:
        rt = app.aio.runtime
        claimed = await notification_outbox._claim(rt.store, "doomed-dispatcher", rt.lease_ttl)
        assert claimed is not None, "nothing to claim"
        related = await rt.store.notifications_for_wait(claimed[0]["wait_id"])
        return notification_outbox._notification(claimed[0], related)

    note = on_app_loop(app, go)
    owner = _owner(app, note)
    sender = next((n for n in notifiers if n.name == owner), None)
    return note, sender.send(note) if sender is not None else None


def _owner(app: keel.App, note: Any) -> str:
    rows = app.get_run(note.run_id).notifications
    return str(next(r["notifier"] for r in rows if r["intent_id"] == note.intent_id))
