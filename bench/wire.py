"""Exact database traffic of one client: PostgreSQL round trips on the wire, SQLite statements.

PostgreSQL: `PgCounter` is a TCP proxy on 127.0.0.1 that the measured client connects through
(`counter.url(real_url)`), so it sees exactly what crosses the socket, whatever the client
library does (pool checks, pipelines, LISTEN), and nothing of other clients on the same
database. It reads the protocol's message boundaries and counts, after each connection's
start-up (authentication and parameters, up to the first ReadyForQuery):

- round trips: each time the client sends after the server answered its previous send (the
  client had to wait for the server; a pipeline sent in one go is one);
- pool checks: empty simple queries (psycopg_pool's `check_connection`);
- transactions: each return to idle (ReadyForQuery 'I') after at least one statement, explicit
  or implicit (an autocommitted statement, a pipeline's statements up to its Sync, and an
  empty query, which PostgreSQL runs as an empty transaction: pg_stat_database's
  xact_commit counts it too);
- writing transactions: those that committed after a statement that wrote (a DML/DDL command
  tag with rows, or a SELECT whose text modifies or locks rows, e.g. a data-modifying CTE or
  FOR SHARE): the ones that cost a WAL flush.

SQLite: `sqlite_counting(path)` wraps `sqlite3.connect` while it is active, so every
connection opened on that file in this process (aiosqlite's thread included) reports its
statements through SQLite's trace callback.

Bench instrumentation only: the proxy adds latency, so timed runs never go through it.
"""

from __future__ import annotations

import os
import re
import selectors
import socket
import sqlite3
import struct
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit, urlunsplit

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_ROWS_TAGS = ("INSERT", "UPDATE", "DELETE", "MERGE", "COPY")
_DDL_TAGS = ("CREATE", "ALTER", "DROP", "TRUNCATE", "NOTIFY")
# A SELECT whose text modifies rows (data-modifying CTE), locks them or notifies: its
# transaction gets an id and its commit is flushed.
_WRITING_TEXT = re.compile(
    r"\b(INSERT\s+INTO|UPDATE\s+\w|DELETE\s+FROM|MERGE\s+INTO|pg_notify)\b"
    r"|\bFOR\s+(NO\s+KEY\s+UPDATE|UPDATE|SHARE|KEY\s+SHARE)\b",
    re.IGNORECASE,
)


@dataclass
class PgCounts:
    round_trips: int = 0
    pool_checks: int = 0
    transactions: int = 0
    writing: int = 0
    connections: int = 0

    def __sub__(self, other: PgCounts) -> PgCounts:
        return PgCounts(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def _wrote(tag: str, sql: str) -> bool:
    word, _, rest = tag.partition(" ")
    if word in _ROWS_TAGS:
        count = rest.rsplit(" ", 1)[-1]
        return count.isdigit() and int(count) > 0
    if word in _DDL_TAGS:
        return True
    return word == "SELECT" and bool(_WRITING_TEXT.search(sql))


class _Conn:
    """One proxied connection: the two sockets and what the protocol says so far."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.to_server = bytearray()  # bytes waiting to be sent, each way
        self.to_client = bytearray()
        self.cbuf = bytearray()  # bytes received and not parsed yet, each way
        self.sbuf = bytearray()
        self.startup = True  # the client's next message has no type byte
        self.ready = False  # the server sent its first ReadyForQuery
        self.server_answered = True  # the server spoke since the client last did
        self.statements: dict[str, str] = {}  # prepared statement name -> SQL
        self.portals: dict[str, str] = {}
        self.pending: deque[tuple[str, str]] = deque()  # ("E"|"Q"|"S", sql) awaiting answers
        self.in_txn_statements = 0
        self.in_txn_wrote = False
        self.in_txn_failed = False


class PgCounter:
    """A counting TCP proxy to one PostgreSQL server, served by a thread of its own."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._lock = threading.Lock()
        self._counts = PgCounts()
        self._conns: set[_Conn] = set()
        self.errors: list[str] = []  # what broke a proxied connection: the counts are short
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="bench-pg-counter", daemon=True)
        self._thread.start()

    def url(self, url: str) -> str:
        """`url` (a database on the upstream server) reached through this proxy."""
        parts = urlsplit(url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth + '@' if auth else ''}127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def snapshot(self) -> PgCounts:
        """The counts so far; raises if a connection broke, since they would be short."""
        if self.errors:
            raise RuntimeError(f"the counting proxy lost a connection: {self.errors[0]}")
        with self._lock:
            return PgCounts(**vars(self._counts))

    def close(self) -> None:
        self._stop = True
        self._wake_w.send(b"x")
        self._thread.join(timeout=10)
        for conn in list(self._conns):
            self._drop(conn)
        self._sel.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> PgCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop:
            for key, events in self._sel.select(timeout=1.0):
                if key.data == "wake":
                    return
                if key.data is None:
                    self._accept()
                    continue
                conn, side = key.data
                try:
                    if events & selectors.EVENT_READ:
                        self._read(conn, side)
                    if events & selectors.EVENT_WRITE:
                        self._flush(conn)
                except OSError:
                    self._drop(conn)  # one side hung up or reset
                except Exception as exc:  # a broken count must be seen, not hang the client
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    self._drop(conn)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self._upstream, timeout=10)
        except OSError as exc:
            self.errors.append(f"cannot reach {self._upstream}: {exc}")
            client.close()
            return
        for s in (client, server):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(client, server)
        self._conns.add(conn)
        self._sel.register(client, selectors.EVENT_READ, (conn, "client"))
        self._sel.register(server, selectors.EVENT_READ, (conn, "server"))

    def _drop(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        for s in (conn.client, conn.server):
            with suppress(KeyError, ValueError):
                self._sel.unregister(s)
            s.close()

    def _read(self, conn: _Conn, side: str) -> None:
        sock = conn.client if side == "client" else conn.server
        try:
            data = sock.recv(1 << 18)
        except BlockingIOError:
            return
        if not data:
            self._drop(conn)
            return
        if side == "client":
            if conn.ready and conn.server_answered:
                with self._lock:
                    self._counts.round_trips += 1
                conn.server_answered = False
            conn.cbuf += data
            self._parse_client(conn)
        else:
            conn.server_answered = True
            conn.to_client += data
            conn.sbuf += data
            self._parse_server(conn)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        if conn not in self._conns:
            return
        for sock, buf in ((conn.server, conn.to_server), (conn.client, conn.to_client)):
            while buf:
                try:
                    sent = sock.send(buf)
                except BlockingIOError:
                    break
                del buf[:sent]
            side = "server" if sock is conn.server else "client"
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if buf else 0)
            self._sel.modify(sock, events, (conn, side))

    # -- the protocol ------------------------------------------------------------------------

    def _parse_client(self, conn: _Conn) -> None:
        buf = conn.cbuf
        while True:
            if conn.startup:
                if len(buf) < 8:
                    return
                (length, code) = struct.unpack("!II", buf[:8])
                if len(buf) < length:
                    return
                if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                    # No encryption through the proxy (it must read the messages): the client
                    # goes on in plain text on this connection, as with a server without SSL.
                    del buf[:length]
                    conn.to_client += b"N"
                    continue
                if code != _CANCEL_REQUEST:
                    with self._lock:
                        self._counts.connections += 1
                conn.to_server += buf[:length]
                del buf[:length]
                conn.startup = False
                continue
            if len(buf) < 5:
                return
            kind = chr(buf[0])
            (length,) = struct.unpack("!I", buf[1:5])
            if len(buf) < 1 + length:
                return
            body = bytes(buf[5 : 1 + length])
            conn.to_server += buf[: 1 + length]
            del buf[: 1 + length]
            if conn.ready:
                self._client_message(conn, kind, body)

    def _client_message(self, conn: _Conn, kind: str, body: bytes) -> None:
        if kind == "Q":
            sql = body.split(b"\0", 1)[0].decode(errors="replace")
            if not sql.strip():
                with self._lock:
                    self._counts.pool_checks += 1
            conn.pending.append(("Q", sql))
        elif kind == "P":
            name, sql = body.split(b"\0", 2)[:2]
            conn.statements[name.decode()] = sql.decode(errors="replace")
        elif kind == "B":
            portal, stmt = body.split(b"\0", 2)[:2]
            conn.portals[portal.decode()] = conn.statements.get(stmt.decode(), "")
        elif kind == "E":
            portal = body.split(b"\0", 1)[0].decode()
            conn.pending.append(("E", conn.portals.get(portal, "")))
        elif kind == "S":
            conn.pending.append(("S", ""))

    def _parse_server(self, conn: _Conn) -> None:
        buf = conn.sbuf
        while len(buf) >= 5:
            kind = chr(buf[0])
            (length,) = struct.unpack("!I", buf[1:5])
            if len(buf) < 1 + length:
                return
            # Only short messages are read; a row of 1 MB is skipped without a copy.
            body = bytes(buf[5 : 1 + length]) if kind in "CZEI" else b""
            del buf[: 1 + length]
            self._server_message(conn, kind, body)

    def _server_message(self, conn: _Conn, kind: str, body: bytes) -> None:
        if kind == "Z":
            status = chr(body[0]) if body else "I"
            if not conn.ready:
                conn.ready = True
                return
            # Everything up to this answer's Sync or query has been answered.
            while conn.pending:
                what, _ = conn.pending.popleft()
                if what in ("S", "Q"):
                    break
            if status == "I":
                if conn.in_txn_statements:
                    with self._lock:
                        self._counts.transactions += 1
                        if conn.in_txn_wrote and not conn.in_txn_failed:
                            self._counts.writing += 1
                conn.in_txn_statements = 0
                conn.in_txn_wrote = conn.in_txn_failed = False
            return
        if not conn.ready or kind not in "CEI":
            return
        sql = ""
        if conn.pending:
            what, sql = conn.pending[0]
            if what == "E":
                conn.pending.popleft()
        conn.in_txn_statements += 1
        if kind == "E":
            conn.in_txn_failed = True
        elif kind == "C":
            tag = body.split(b"\0", 1)[0].decode(errors="replace")
            if tag == "ROLLBACK":
                conn.in_txn_failed = True
            elif _wrote(tag, sql):
                conn.in_txn_wrote = True


# -- SQLite ---------------------------------------------------------------------------------

_SQL_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE|CREATE|ALTER|DROP)\b", re.IGNORECASE)
_SQL_COMMIT = re.compile(r"^\s*(COMMIT|END)\b", re.IGNORECASE)
_SQL_ROLLBACK = re.compile(r"^\s*ROLLBACK\s*(TRANSACTION)?\s*;?\s*$", re.IGNORECASE)


@dataclass
class SqliteCounts:
    statements: int = 0
    commits: int = 0
    durable: int = 0  # commits whose transaction wrote: the ones that cost an fsync
    connections: int = 0

    def __sub__(self, other: SqliteCounts) -> SqliteCounts:
        return SqliteCounts(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


class SqliteTrace:
    """Counts statements and commits of the SQLite connections it is the trace callback of.

    Statements run by triggers (reported as `-- trigger` comments) are not counted: they are
    part of the statement that fired them. A statement outside a transaction that writes is
    its own durable commit (autocommit).
    """

    def __init__(self) -> None:
        self.counts = SqliteCounts()
        self._lock = threading.Lock()
        self._dirty: dict[int, bool] = {}
        self._in_txn: dict[int, bool] = {}

    def callback(self, conn_id: int) -> Any:
        def trace(statement: str) -> None:
            head = statement[:200]
            if head.lstrip().startswith("--"):
                return
            with self._lock:
                c = self.counts
                c.statements += 1
                if re.match(r"^\s*BEGIN\b", head, re.IGNORECASE):
                    self._in_txn[conn_id] = True
                    self._dirty[conn_id] = False
                elif _SQL_COMMIT.match(head):
                    c.commits += 1
                    if self._dirty.get(conn_id):
                        c.durable += 1
                    self._in_txn[conn_id] = self._dirty[conn_id] = False
                elif _SQL_ROLLBACK.match(head):
                    self._in_txn[conn_id] = self._dirty[conn_id] = False
                elif _SQL_WRITE.match(head):
                    if self._in_txn.get(conn_id):
                        self._dirty[conn_id] = True
                    else:
                        c.commits += 1
                        c.durable += 1

        return trace

    def snapshot(self) -> SqliteCounts:
        with self._lock:
            return SqliteCounts(**vars(self.counts))


_patch_lock = threading.Lock()
_traced: dict[str, SqliteTrace] = {}
_original_connect = sqlite3.connect


def _counting_connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _original_connect(database, *args, **kwargs)
    trace = _traced.get(_key(database))
    if trace is not None:
        with trace._lock:
            trace.counts.connections += 1
        conn.set_trace_callback(trace.callback(id(conn)))
    return conn


def _key(database: Any) -> str:
    text = os.fspath(database) if not isinstance(database, str) else database
    text = text.removeprefix("file:").split("?", 1)[0]
    return os.path.realpath(text)


@contextmanager
def sqlite_counting(path: str) -> Iterator[SqliteTrace]:
    """Count the statements of every connection this process opens on `path` meanwhile."""
    trace = SqliteTrace()
    key = _key(path)
    with _patch_lock:
        if key in _traced:
            raise RuntimeError(f"{path} is already being counted")
        _traced[key] = trace
        sqlite3.connect = _counting_connect  # type: ignore[assignment]
    try:
        yield trace
    finally:
        with _patch_lock:
            del _traced[key]
            if not _traced:
                sqlite3.connect = _original_connect
