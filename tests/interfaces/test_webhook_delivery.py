"""How one completion webhook reaches its receiver, on both backends, against real servers on
127.0.0.1: the connection goes to the address the host was checked at, whatever a resolver
answers a moment later; a receiver that drips its answer or never gives one holds a delivery
lane no longer than the delivery's deadline; a `Retry-After` as a date or past the cap sets
the back-off.

The resolver is the one thing simulated (`socket.getaddrinfo`, patched in this process): it
plays a DNS server that changes its answer between two lookups."""

from __future__ import annotations

import email.utils
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.core.effects import dispatch as effect_dispatch
from keel.core.webhooks import new_secret
from keel.runtime import webhooks
from keel.testing.netproxy import NetProxy
from tests.support.graphs import echo_graph
from tests.support.webhook_receiver import Receiver, receiving
from tests.support.workers import claim, drain, execute

SECRET = new_secret()
HOST = "hooks.test"
AppFactory = Callable[..., keel.App]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving(SECRET) as r:
        yield r


def _app(make_app: AppFactory, allow: str = "127.0.0.1", **kwargs: Any) -> keel.App:
    made = make_app(webhook_secret=SECRET, webhook_allow_hosts=[allow], **kwargs)
    made.workflow("echo")(echo_graph)
    return made


def _intent(app: keel.App, run_id: str) -> dict[str, Any]:
    (intent,) = app.effect_intents(run_id=run_id)
    return intent


# -- the address checked is the address connected to ---------------------------------------------


@dataclass
class Resolver:
    """A DNS server for HOST: each lookup takes the next answer of `script`, the last one
    sticking. Every other name is resolved as usual."""

    real: Callable[..., Any]
    script: list[str] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != HOST:
            return self.real(host, port, *args, **kwargs)
        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        self.lookups.append(answer)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (answer, port))]


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Resolver:
    fake = Resolver(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@contextmanager
def internal_service(port: int) -> Iterator[list[bytes]]:
    """What a rebinding attack aims at: a service on 127.0.0.2 (not allowed), answering 200 to
    whatever reaches it; the requests it was sent."""
    got: list[bytes] = []
    server = socket.create_server(("127.0.0.2", port))
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                got.append(conn.recv(65536))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        done.set()
        thread.join(timeout=5)
        server.close()


def test_a_dns_answer_that_changes_after_the_check_is_not_followed(
    make_app: AppFactory, receiver: Receiver, resolver: Resolver
) -> None:
    """The host resolves to 127.0.0.1 (allowed) when checked, and to 127.0.0.2 (not allowed)
    at every lookup after: the delivery goes to 127.0.0.1, under the host's name."""
    app = _app(make_app, allow="127.0.0.1/32")
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    url = f"http://{HOST}:{port}/hook?tenant=7"
    resolver.script = ["127.0.0.1"]
    run = app.submit("echo", {"text": "x"}, webhook=url)
    with internal_service(port) as internal:
        resolver.script = ["127.0.0.1", "127.0.0.2"]  # flips after the delivery's first lookup
        at_submit = len(resolver.lookups)
        drain(app)
    assert internal == [], "nothing reached the address the check never saw"
    (delivery,) = receiver.all()
    assert delivery.valid and delivery.id == f"webhook:{run.run_id}:0"
    assert delivery.headers["host"] == f"{HOST}:{port}"
    assert _intent(app, run.run_id)["status"] == "delivered"
    assert resolver.lookups[at_submit:] == ["127.0.0.1"], "one lookup per delivery"


def test_a_host_that_now_resolves_privately_is_refused_at_delivery(
    make_app: AppFactory, receiver: Receiver, resolver: Resolver
) -> None:
    app = _app(make_app, allow="127.0.0.1/32")
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    resolver.script = ["127.0.0.1"]
    run = app.submit("echo", {"text": "x"}, webhook=f"http://{HOST}:{port}/hook")
    with internal_service(port) as internal:
        resolver.script = ["127.0.0.2"]
        drain(app)
    assert internal == [] and receiver.all() == []
    intent = _intent(app, run.run_id)
    assert intent["status"] == "dead" and "127.0.0.2, a private address" in intent["error"]


@contextmanager
def tls_receiver(tmp_path: Path) -> Iterator[tuple[int, Path, list[tuple[str | None, str]]]]:
    """An https receiver on 127.0.0.1 with a self-signed certificate for HOST: its port, the
    certificate (to trust), and (SNI name, Host header) of every request it answered."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", f"/CN={HOST}", "-addext", f"subjectAltName=DNS:{HOST}"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    seen: list[tuple[str | None, str]] = []
    names: dict[int, str | None] = {}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def sni(sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
        names[id(sock)] = name

    context.sni_callback = sni

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((names.get(id(self.connection)), self.headers.get("Host", "")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1]), cert, seen
    finally:
        server.shutdown()
        server.server_close()


def test_https_checks_the_certificate_for_the_host_name_not_the_address(
    make_app: AppFactory, resolver: Resolver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _app(make_app, allow="127.0.0.1/32", webhook_attempts=1)
    resolver.script = ["127.0.0.1"]
    with tls_receiver(tmp_path) as (port, cert, seen):
        untrusted = app.submit("echo", {"text": "x"}, webhook=f"https://{HOST}:{port}/hook")
        drain(app)
        intent = _intent(app, untrusted.run_id)
        assert intent["status"] == "dead" and "CERTIFICATE_VERIFY_FAILED" in intent["error"]
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        run = app.submit("echo", {"text": "y"}, webhook=f"https://{HOST}:{port}/hook")
        drain(app)
    assert _intent(app, run.run_id)["status"] == "delivered"
    assert seen == [(HOST, f"{HOST}:{port}")], "SNI and Host name the host, not 127.0.0.1"


# -- a receiver that never finishes answering --------------------------------------------------


@contextmanager
def dripping() -> Iterator[tuple[str, list[int]]]:
    """A receiver on 127.0.0.1 that reads the request, then writes its answer one byte a
    second, never ending it: its URL, and a list with one entry per connection it accepted."""
    accepted: list[int] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def drip(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            answer = b"HTTP/1.1 200 OK\r\nX-Drip: " + b"a" * 10_000
            for byte in answer:
                if done.wait(1.0):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return  # the client gave up

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(1)
            threading.Thread(target=drip, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/hook", accepted
    finally:
        done.set()
        thread.join(timeout=5)
        server.close()


def test_a_dripping_receiver_holds_a_lane_only_until_the_deadline(
    make_app: AppFactory, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One webhook lane (KEEL_OUTBOX_CONCURRENCY=2): a receiver dripping a byte a second would
    hold it for ever. Each attempt ends at the deadline and is retried, the other webhooks go
    out meanwhile, and after its attempts the dripping one is dead, saying why."""
    monkeypatch.setenv("KEEL_OUTBOX_CONCURRENCY", "2")
    app = _app(make_app, webhook_deadline=1.5, webhook_attempts=2)
    with dripping() as (url, accepted):
        slow = app.submit("echo", {"text": "slow"}, webhook=url)
        others = [app.submit("echo", {"text": f"o{i}"}, webhook=receiver.url) for i in range(3)]
        drain(app)
    assert len(accepted) == 2, "two attempts, each ended by the deadline"
    intent = _intent(app, slow.run_id)
    assert intent["status"] == "dead" and intent["attempts"] == 2
    assert "no complete answer within its 1.5s deadline" in intent["error"]
    assert sorted(d.id for d in receiver.all()) == sorted(f"webhook:{r.run_id}:0" for r in others)


def test_a_receiver_that_never_answers_is_retried_under_the_same_id(
    make_app: AppFactory, receiver: Receiver
) -> None:
    """Behind a proxy that holds every reply, the receiver gets each request and the sender
    never hears back: each attempt ends at the deadline and the same delivery is sent again."""
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    app = _app(make_app, webhook_deadline=1.0, webhook_attempts=2)
    with NetProxy("127.0.0.1", port) as proxy:
        proxy.hold_replies(3600)
        run = app.submit("echo", {"text": "x"}, webhook=f"http://127.0.0.1:{proxy.port}/hook")
        drain(app)
        assert proxy.counters().accepted == 2
    got = receiver.all()
    assert [d.id for d in got] == [f"webhook:{run.run_id}:0"] * 2
    assert got[0].body == got[1].body and all(d.valid for d in got)
    intent = _intent(app, run.run_id)
    assert intent["status"] == "dead" and "within its 1s deadline" in intent["error"]


# -- Retry-After ---------------------------------------------------------------------------------


def _one_delivery_pass(app: keel.App) -> int:
    """Deliver what is due once, as a dispatcher's pass does (no worker: nothing waits)."""
    rt = app.aio.runtime

    async def go() -> int:
        webhooks.DELIVERING.set(rt.services)
        return await effect_dispatch.dispatch(rt.services, "w-test", effect_dispatch.Pacing())

    return rt.portal.call(go())


def _due_in(app: keel.App) -> float:
    rt = app.aio.runtime
    seconds = rt.portal.call(rt.store.intents_due_in())
    assert seconds is not None
    return float(seconds)


@pytest.mark.parametrize(
    ("retry_after", "low", "high"),
    [
        (lambda: email.utils.formatdate(time.time() + 120, usegmt=True), 100.0, 120.0),
        (lambda: "86400", 280.0, 300.0),  # capped at the back-off's maximum
    ],
    ids=["http-date", "huge"],
)
def test_retry_after_as_a_date_or_past_the_cap_sets_the_next_attempt(
    make_app: AppFactory,
    receiver: Receiver,
    retry_after: Callable[[], str],
    low: float,
    high: float,
) -> None:
    app = _app(make_app)
    run = app.submit("echo", {"text": "x"}, webhook=receiver.url)
    lease, row = claim(app, "w-1")
    assert execute(app, lease, row) == "completed"
    receiver.retry_after = retry_after()
    receiver.fail_for(3600)
    assert _one_delivery_pass(app) == 1
    intent = _intent(app, run.run_id)
    assert (intent["status"], intent["attempts"]) == ("pending", 1)
    assert "503" in intent["error"]
    assert low < _due_in(app) <= high
    assert [d.status for d in receiver.all()] == [503]
    assert _one_delivery_pass(app) == 0, "not due before its time"
