"""keel.testing.netproxy: the TCP proxy partition tests break on demand, on plain sockets."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from keel.testing.netproxy import NetProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):  # a reset (cut) ends it
            while data := self.request.recv(4096):
                self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[NetProxy]:
    with NetProxy(*echo) as running:
        yield running


def _client(proxy: NetProxy) -> socket.socket:
    sock = socket.create_connection(proxy.address, timeout=5)
    sock.settimeout(5)
    return sock


def _recv(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got


def _silent(sock: socket.socket, seconds: float) -> bool:
    """Nothing arrives (and the connection is not closed) within `seconds`."""
    sock.settimeout(seconds)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)
    return False


def test_forwards_both_ways_and_counts(proxy: NetProxy) -> None:
    with _client(proxy) as sock:
        sock.sendall(b"hello")
        assert _recv(sock, 5) == b"hello"
    counted = proxy.counters()
    assert (counted.accepted, counted.bytes_up, counted.bytes_down) == (1, 5, 5)


def test_hang_holds_both_ways_and_heal_delivers_what_was_held(proxy: NetProxy) -> None:
    with _client(proxy) as early:
        proxy.hang()
        early.sendall(b"held")
        late = _client(proxy)  # accepted while hanging, held too
        late.sendall(b"later")
        assert _silent(early, 0.3) and _silent(late, 0.1)
        assert proxy.counters().held == 9 and proxy.counters().bytes_up == 0
        proxy.heal()
        assert _recv(early, 4) == b"held"
        assert _recv(late, 5) == b"later"
        late.close()


def test_half_open_swallows_forever_and_answers_nothing(proxy: NetProxy) -> None:
    with _client(proxy) as sock:
        sock.sendall(b"ping")
        assert _recv(sock, 4) == b"ping"
        proxy.half_open()
        sock.sendall(b"anyone?")
        with _client(proxy) as fresh:  # new connections are accepted and swallowed too
            fresh.sendall(b"hi")
            assert _silent(sock, 0.3) and _silent(fresh, 0.1)
        time.sleep(0.1)
        counted = proxy.counters()
        assert counted.swallowed == 9 and counted.bytes_up == 4, counted
        proxy.heal()
        assert _silent(sock, 0.2)  # its server side is gone for good: still a black hole
        with _client(proxy) as after:  # new connections forward again
            after.sendall(b"back")
            assert _recv(after, 4) == b"back"


def test_hold_replies_delays_only_the_server_to_client_direction(proxy: NetProxy) -> None:
    with _client(proxy) as sock:
        proxy.hold_replies(0.5)
        started = time.monotonic()
        sock.sendall(b"slow")
        assert _recv(sock, 4) == b"slow"
        assert time.monotonic() - started >= 0.45
        assert proxy.counters().bytes_up == 4
        proxy.hold_replies(30)
        sock.sendall(b"x")
        assert _silent(sock, 0.2)
        proxy.heal()  # what was held goes at once
        assert _recv(sock, 1) == b"x"


def test_cut_resets_every_connection_and_keeps_the_mode(proxy: NetProxy) -> None:
    with _client(proxy) as sock:
        sock.sendall(b"a")
        assert _recv(sock, 1) == b"a"
        proxy.cut()
        with pytest.raises(OSError):
            sock.sendall(b"b")
            if not sock.recv(1):
                raise ConnectionResetError("closed")
    assert proxy.counters().open == 0
    with _client(proxy) as again:
        again.sendall(b"c")
        assert _recv(again, 1) == b"c"


def test_url_for_rewrites_host_and_port_only(proxy: NetProxy) -> None:
    url = proxy.url_for("postgresql://keel:secret@db.example:5432/keel?sslmode=disable")
    assert url == f"postgresql://keel:secret@127.0.0.1:{proxy.port}/keel?sslmode=disable"
    assert proxy.url_for("postgresql://db/keel") == f"postgresql://127.0.0.1:{proxy.port}/keel"
