"""What bounds a wait on PostgreSQL (docs/operations.md, "Network partitions and half-open
connections"): TCP's own options on every connection, and the round-trip bound on every checkout
of a pooled one, past which its socket is shut down under psycopg and `RoundTripTimeout`, an
infrastructure fault, is raised."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict

from keel.core.errors import UsageError

log = logging.getLogger("keel.store")

ROUND_TRIP_SETTING = "KEEL_DB_ROUND_TRIP_TIMEOUT"
"""Seconds a checkout of a pooled connection may take before it is abandoned (`0` or `off`:
unbounded). Default: a third of the lease TTL, at least `MIN_ROUND_TRIP`."""
MIN_ROUND_TRIP = 2.0


def round_trip_bound(lease_ttl: float, setting: str | None = None) -> float | None:
    """The round-trip bound for a lease TTL, unless `setting` (KEEL_DB_ROUND_TRIP_TIMEOUT's
    value) says otherwise: a third of the TTL, so a worker on a dead path notices while its
    leases still hold, and at least a few seconds, so a busy server is not taken for a dead
    one."""
    if setting is not None and setting.strip():
        text = setting.strip().lower()
        if text in ("0", "off", "none"):
            return None
        try:
            value = float(text.removesuffix("s"))
        except ValueError:
            raise UsageError(
                f"{ROUND_TRIP_SETTING} must be seconds (or 0/off), not {setting!r}"
            ) from None
        return value if value > 0 else None
    return max(lease_ttl / 3, MIN_ROUND_TRIP)


def connection_options(url: str, lease_ttl: float, bound: float | None) -> dict[str, Any]:
    """libpq options that bound what TCP itself waits for, unless `url` sets them: keepalives
    on an idle connection (first probe after a third of the lease TTL), a TCP user timeout
    (unacknowledged data or probes for two thirds of it end the connection) and a connect
    timeout (the round-trip bound). Ignored on a Unix socket. Behind a proxy whose own kernel
    acknowledges what it swallows, TCP never notices: the round-trip bound does."""
    given = conninfo_to_dict(url)
    wanted: dict[str, Any] = {
        "keepalives": 1,
        "keepalives_idle": max(1, round(lease_ttl / 3)),
        "keepalives_interval": max(1, round(lease_ttl / 10)),
        "keepalives_count": 3,
        "tcp_user_timeout": max(1000, int(lease_ttl * 2000 / 3)),
        "connect_timeout": max(2, math.ceil(bound if bound is not None else lease_ttl / 3)),
    }
    if "PGCONNECT_TIMEOUT" in os.environ:
        del wanted["connect_timeout"]
    return {name: value for name, value in wanted.items() if name not in given}


class RoundTripTimeout(psycopg.OperationalError):
    """A round trip to PostgreSQL got no answer within the bound: its connection was abandoned
    (closed, never returned to the pool). An infrastructure fault, as a lost connection is."""


class Watch:
    """Armed for one checkout: past `bound`, shut the connection's socket down under psycopg.

    Not `asyncio.timeout`: cancelling a coroutine inside psycopg makes it send a cancel request
    on a new connection and wait for the server to answer it (up to 5 s each), over the same
    dead path. A socket shut down wakes whatever waits on it at once (end of file, or a broken
    pipe), libpq calls the connection lost, and psycopg raises OperationalError: no request,
    no wait, nothing that can hang.

    The bound judges the path, not the worker: a timer that fires late (the event loop or the
    whole process was starved: a GC pause, CPU steal, a loaded host) first looks whether the
    answer is already waiting on the socket, and gives the path once more the time the loop
    was away, up to one bound more: a dead path is abandoned within twice the bound."""

    __slots__ = ("bound", "conn", "fired", "handle", "last_chance", "what")

    def __init__(self, conn: AsyncConnection[Any], bound: float, what: str) -> None:
        self.conn, self.bound, self.what, self.fired = conn, bound, what, False
        self.handle: asyncio.TimerHandle | None = None
        self.last_chance: float | None = None

    def __enter__(self) -> Watch:
        self.handle = asyncio.get_running_loop().call_later(self.bound, self._fire)
        return self

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        assert self.handle is not None
        self.handle.cancel()
        if (
            self.fired
            and isinstance(exc, psycopg.Error | OSError)
            and not isinstance(exc, RoundTripTimeout)
        ):
            raise RoundTripTimeout(
                f"no answer from PostgreSQL within {self.bound:g} s ({self.what}): connection "
                f"abandoned ({ROUND_TRIP_SETTING})"
            ) from exc

    def _fire(self) -> None:
        assert self.handle is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.conn in unbounded:  # a migration's DDL or lock wait: look again later
            self.handle = loop.call_later(self.bound, self._fire)
            return
        try:
            fd = self.conn.pgconn.socket
        except psycopg.Error:
            return  # closed meanwhile
        if self.last_chance is None:
            self.last_chance = now + self.bound
        late = now - self.handle.when()
        waiting = _answered(fd)
        if now < self.last_chance and (waiting or late > self.bound * STARVED_SHARE):
            # The loop, not the path, was slow: psycopg reads a waiting answer next; a stalled
            # loop gives the path back the time it was away.
            again = STARVED_GRACE if waiting else late
            self.handle = loop.call_at(min(now + again, self.last_chance), self._fire)
            return
        self.fired = True
        _warn_timeout(self.conn, self.bound, self.what)
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays libpq's: closed with the connection


STARVED_SHARE = 0.25
"""A timer this share of the bound late means the loop was away: the path gets that time again."""
STARVED_GRACE = 0.1
"""Seconds before looking again at a connection whose answer was waiting unread."""


def _answered(fd: int) -> bool:
    """Whether something (an answer, or the end of the stream) waits unread on the socket.
    `poll`, not `select`: a busy process's descriptors pass 1024."""
    looking = select.poll()
    try:
        looking.register(fd, select.POLLIN)
        return bool(looking.poll(0))
    except (OSError, ValueError):
        return False


unbounded: set[AsyncConnection[Any]] = set()
"""Connections running what the round-trip bound must not cut short (see `exempt`)."""

UNBOUNDED_QUERIES = frozenset({"migration_lock"})
"""Queries that wait for another process on purpose (a migration in progress elsewhere)."""


@contextlib.contextmanager
def exempt(conn: AsyncConnection[Any]) -> Iterator[None]:
    """Not bounded: schema migrations (DDL may rewrite a large table) and the wait for the
    migration lock. They run from `keel migrate`, not in a worker's steps; TCP keepalives and
    the user timeout still end them on a dead path."""
    unbounded.add(conn)
    try:
        yield
    finally:
        unbounded.discard(conn)


WARN_EVERY = 30.0
"""Seconds between two warnings of timed-out round trips (one outage times out many)."""
_warned = {"at": -math.inf, "since": 0}


def _warn_timeout(conn: AsyncConnection[Any], bound: float, what: str) -> None:
    now = time.monotonic()
    if now - _warned["at"] < WARN_EVERY:
        _warned["since"] += 1
        log.info("PostgreSQL round trip (%s) timed out after %g s", what, bound)
        return
    more = _warned["since"]
    _warned["at"], _warned["since"] = now, 0
    try:
        where = f"{conn.info.host}:{conn.info.port}"
    except psycopg.Error:
        where = "the server"
    log.warning(
        "PostgreSQL round trip (%s) got no answer from %s within %g s (%s): connection "
        "abandoned; the network path may be down or half-open%s",
        what,
        where,
        bound,
        ROUND_TRIP_SETTING,
        f" ({more} more timed out since the last warning)" if more else "",
        extra={"event": "database.round_trip_timeout"},
    )


def watched(conn: AsyncConnection[Any], bound: float | None, what: str) -> Any:
    return Watch(conn, bound, what) if bound is not None else contextlib.nullcontext()
