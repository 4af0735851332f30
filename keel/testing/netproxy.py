"""A TCP proxy on 127.0.0.1 whose network can be broken on demand, for partition tests.

`NetProxy(host, port)` listens on 127.0.0.1 (an ephemeral port, `.port`) and forwards every
connection to `host:port`. It runs its own event loop in a daemon thread, so a test drives it
from sync or async code alike, and worker subprocesses connect through it like any client
(`.url_for(database_url)` points a PostgreSQL URL at it)::

    with NetProxy("127.0.0.1", 5432) as proxy:
        worker = spawn_worker(APP, database_url=proxy.url_for(url), lease_ttl=3)
        proxy.half_open()   # a NAT/load balancer that lost the flow
        ...
        proxy.heal()

Modes apply at once, to open connections and new ones alike:

- `heal()` (the start): forward both ways.
- `hang()`: a partition that hangs. Nothing is forwarded either way and nothing is closed;
  what either side sends is read and held (`Counters.held`). New connections are accepted and
  held too (not connected to the target until healed). `heal()` delivers everything held, in
  order, then forwards again.
- `half_open()`: the server side of every connection is dropped (its socket closed) while the
  client side stays open: every byte a client sends is accepted and swallowed, nothing is ever
  sent back, the client side is never closed. New connections are accepted and swallowed too.
  A connection that lost its server side stays a black hole after `heal()` (only new
  connections are forwarded again), until `cut()` or its client closes it.
- `hold_replies(seconds)`: client -> server bytes go at once, server -> client bytes are
  delivered `seconds` after they arrived (in order). `heal()` delivers what is held at once.
- `cut()`: an event, not a mode: every open connection is reset (RST) on both sides; the mode
  stays as it was for new connections.

`counters()` tells what happened (connections accepted, bytes delivered each way, swallowed,
held). Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

Mode = Literal["pass", "hang", "half_open", "hold"]
T = TypeVar("T")

_CHUNK = 64 * 1024
_EOF = None
"""Queued after a side's last bytes: the other side is closed once it is delivered."""


@dataclass(frozen=True)
class Counters:
    accepted: int
    """Client connections accepted since start."""
    open: int
    """Client connections open now."""
    bytes_up: int
    """Bytes delivered to the target (client -> server)."""
    bytes_down: int
    """Bytes delivered to clients (server -> client)."""
    swallowed: int
    """Client bytes accepted and dropped (half-open)."""
    held: int
    """Bytes read and not delivered yet (hang, held replies)."""


class _Link:
    """One client connection and, once it is made, its connection to the target."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.client_r, self.client_w = reader, writer
        self.server_r: asyncio.StreamReader | None = None
        self.server_w: asyncio.StreamWriter | None = None
        self.dropped = False
        """The server side is gone (half-open): client bytes are swallowed from now on."""
        self.queues: dict[str, deque[tuple[float, bytes | None]]] = {
            "up": deque(),
            "down": deque(),
        }
        self.kick = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def held(self) -> int:
        return sum(len(data or b"") for q in self.queues.values() for _, data in q)


class NetProxy:
    """A TCP proxy from 127.0.0.1:`port` to `target_host:target_port` (see the module doc)."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"):
        self.target_host, self.target_port = target_host, target_port
        self.listen_host = listen_host
        self.port = 0
        self._mode: Mode = "pass"
        self._delay = 0.0
        self._links: set[_Link] = set()
        self._accepted = self._up = self._down = self._swallowed = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    # -- lifetime ----------------------------------------------------------------------------

    def start(self) -> NetProxy:
        """Start listening (in a thread of its own); returns self once `.port` is known."""
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="netproxy", daemon=True)
        self._thread.start()
        self._server = self._call(self._listen())
        return self

    def stop(self) -> None:
        """Reset every connection, stop listening, end the thread."""
        loop = self._loop
        if loop is None:
            return
        self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> NetProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- where to connect ----------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self.listen_host, self.port

    def url_for(self, url: str) -> str:
        """`url` (postgresql://user:pw@host:port/db?...) with its host and port this proxy's.
        A host given in the query string (`?host=`) is not rewritten."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        netloc += f"{self.listen_host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- modes (from any thread but the proxy's) -----------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._mode

    def heal(self) -> None:
        """Forward both ways; deliver what was held (hang, held replies) at once, in order."""
        self._apply(self._set_pass)

    pass_through = heal

    def hang(self) -> None:
        """Forward nothing, close nothing: hold every byte until `heal()`."""
        self._apply(lambda: self._set("hang"))

    def half_open(self) -> None:
        """Drop every server side; accept and swallow whatever clients send, answer nothing."""
        self._apply(self._set_half_open)

    def hold_replies(self, seconds: float) -> None:
        """Deliver server -> client bytes `seconds` after they arrive (client -> server at once)."""
        if seconds < 0:
            raise ValueError("seconds must be >= 0")

        def hold() -> None:
            self._delay = seconds
            self._set("hold")

        self._apply(hold)

    def cut(self) -> None:
        """Reset every open connection on both sides (the mode stays as it is)."""
        self._call(self._cut())

    def counters(self) -> Counters:
        def read() -> Counters:
            return Counters(
                accepted=self._accepted,
                open=len(self._links),
                bytes_up=self._up,
                bytes_down=self._down,
                swallowed=self._swallowed,
                held=sum(link.held() for link in self._links),
            )

        return self._apply(read)

    # -- the loop's side -------------------------------------------------------------------------

    def _call(self, coro: Any) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not running: start() it first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _apply(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        result: T = self._call(run())
        return result

    def _set(self, mode: Mode) -> None:
        self._mode = mode
        for link in self._links:
            link.kick.set()

    def _set_pass(self) -> None:
        for link in self._links:
            for queue in link.queues.values():
                for i, (_, data) in enumerate(queue):
                    queue[i] = (0.0, data)
        self._set("pass")

    def _set_half_open(self) -> None:
        for link in self._links:
            self._drop_server(link)
        self._set("half_open")

    def _drop_server(self, link: _Link) -> None:
        link.dropped = True
        link.queues["up"].clear()
        link.queues["down"].clear()
        if link.server_w is not None:
            link.server_w.transport.abort()

    async def _listen(self) -> asyncio.Server:
        server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = int(server.sockets[0].getsockname()[1])
        return server

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()
        if self._server is not None:
            await self._server.wait_closed()

    async def _cut(self) -> None:
        links, self._links = list(self._links), set()
        for link in links:
            for writer in (link.client_w, link.server_w):
                if writer is not None:
                    _reset(writer)
            for task in link.tasks:
                task.cancel()
        for link in links:
            await asyncio.gather(*link.tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(reader, writer)
        self._accepted += 1
        self._links.add(link)
        if self._mode == "half_open":
            link.dropped = True
        for coro in (
            self._read(link, "up"),
            self._deliver(link, "up"),
            self._deliver(link, "down"),
            self._connect(link),
        ):
            task = asyncio.create_task(coro)
            link.tasks.add(task)

    async def _connect(self, link: _Link) -> None:
        while self._mode == "hang" and not link.dropped:
            link.kick.clear()
            await link.kick.wait()
        if link.dropped:
            return
        try:
            link.server_r, link.server_w = await asyncio.open_connection(
                self.target_host, self.target_port
            )
        except OSError:
            self._close(link)
            return
        if link.dropped:  # half-open while connecting
            link.server_w.transport.abort()
            return
        link.kick.set()
        await self._read(link, "down")

    async def _read(self, link: _Link, direction: str) -> None:
        reader = link.client_r if direction == "up" else link.server_r
        assert reader is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                data: bytes | None = await reader.read(_CHUNK)
            except OSError:
                data = b""
            if direction == "down" and link.dropped:
                return  # the server side we dropped: nothing of it reaches the client
            if direction == "up" and link.dropped:
                if not data:
                    self._close(link)  # the client gave up on its black hole
                    return
                self._swallowed += len(data)
                continue
            data = data or _EOF
            due = loop.time() + self._delay if direction == "down" and self._mode == "hold" else 0
            link.queues[direction].append((due, data))
            link.kick.set()
            if data is _EOF:
                return

    async def _deliver(self, link: _Link, direction: str) -> None:
        queue = link.queues[direction]
        loop = asyncio.get_running_loop()
        while True:
            writer = link.server_w if direction == "up" else link.client_w
            blocked = self._mode == "hang" or link.dropped or writer is None
            if not queue or blocked:
                link.kick.clear()
                await link.kick.wait()
                continue
            due, data = queue[0]
            if due > loop.time():
                link.kick.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(link.kick.wait(), due - loop.time())
                continue
            queue.popleft()
            assert writer is not None
            if data is _EOF:
                self._close(link)
                return
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                self._close(link)
                return
            if direction == "up":
                self._up += len(data)
            else:
                self._down += len(data)

    def _close(self, link: _Link) -> None:
        """One side ended: close both (unless the server side was dropped: the client stays)."""
        if link.dropped and not link.client_r.at_eof():
            return
        self._links.discard(link)
        for writer in (link.client_w, link.server_w):
            if writer is not None:
                writer.close()
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a RST (SO_LINGER 0), not a FIN: the peer sees ECONNRESET."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
