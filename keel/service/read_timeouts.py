"""Read timeouts for `keel serve`: a client that sends its request slowly is cut off.

uvicorn bounds the silence between requests on a kept-alive connection, but not how long a
request's headers or body may take to arrive: a client that sends one header line every few
seconds (or never finishes its body) holds a connection, and a coroutine, as long as it likes.
A few hundred of them starve the server. This protocol, uvicorn's own h11 one with two timers,
closes a connection whose request headers are not complete `header_timeout` seconds after its
first byte (or after the connection opened), or whose body is not complete `body_timeout`
seconds after its headers. What the application does with a request is not bounded here.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from keel.core.clock import parse_duration
from keel.core.errors import UsageError

HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 30.0
log = logging.getLogger("keel.service")


def read_timeouts(
    header_timeout: float | str | None = None, body_timeout: float | str | None = None
) -> tuple[float, float]:
    """The timeouts to serve with: given, else $KEEL_HTTP_HEADER_TIMEOUT and
    $KEEL_HTTP_BODY_TIMEOUT, else 10 s and 30 s."""
    header = header_timeout or os.environ.get("KEEL_HTTP_HEADER_TIMEOUT") or HEADER_TIMEOUT
    body = body_timeout or os.environ.get("KEEL_HTTP_BODY_TIMEOUT") or BODY_TIMEOUT
    try:
        return parse_duration(header), parse_duration(body)
    except ValueError as exc:  # a traceback from `keel serve --header-timeout nan` before
        raise UsageError(f"HTTP read timeout: {exc}") from None


def protocol_with(header_timeout: float, body_timeout: float) -> type[H11Protocol]:
    """uvicorn's `http=` class for these timeouts."""
    return type(
        "KeelH11Protocol",
        (TimedReads,),
        {"header_timeout": header_timeout, "body_timeout": body_timeout},
    )


class TimedReads(H11Protocol):
    header_timeout = HEADER_TIMEOUT
    body_timeout = BODY_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._read_timer: asyncio.TimerHandle | None = None
        self._watched: Any = None
        self._arm(self.header_timeout, "headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Between requests uvicorn's keep-alive timeout applies; the next request's headers
        # get their own timer when its first byte arrives.
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle is not self._watched:
            self._watched = cycle  # a new request: its headers are complete
            self._disarm()
            if cycle.more_body:
                self._arm(self.body_timeout, "body")
        elif cycle is not None and not cycle.response_complete:
            if not cycle.more_body:
                self._disarm()  # the body is complete; the application has the request
        elif self._read_timer is None:
            self._arm(self.header_timeout, "headers")  # the first bytes of the next request

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._too_slow, what, seconds)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _too_slow(self, what: str, seconds: float) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            log.warning("closed %s: its request %s took longer than %.0f s", client, what, seconds)
            self.transport.close()
