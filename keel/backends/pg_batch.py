"""A PostgreSQL transaction sent as one simple-query message (`PostgresConnector.run_transaction`).

The server reads a whole message before it runs any of it, so a worker frozen while it sends
holds no lock (a pipeline runs its statements as they arrive, and nothing ends a transaction
that waits for the rest of its pipeline). The statements are bound here with psycopg's own
adapters. Each one that repeats is PREPAREd once per connection, in the message that first
runs it, and EXECUTEd after: the server then parses and plans a step's statements once per
connection rather than in every step, as psycopg's own prepared statements would have it do.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import re
import weakref
from typing import Any

import psycopg
from psycopg import AsyncConnection, adapt, errors, generators
from psycopg.abc import Transformer
from psycopg.pq import ExecStatus
from psycopg.pq.abc import PGresult
from psycopg.rows import DictRow
from psycopg.types.json import Json, Jsonb

from keel.core.store.base import Later, Params, Row, Statement

SET_FAKE_NOW = "SELECT set_config('keel.fake_now', %s, false)"

_PLACEHOLDER = re.compile(r"%(?:\((?P<name>[^)]+)\))?(?P<format>[sbt])|%%")
_names = itertools.count(1)
_prepared: weakref.WeakKeyDictionary[AsyncConnection[Any], dict[str, str]] = (
    weakref.WeakKeyDictionary()
)
"""Per connection, the SQL of each statement PREPAREd on it and its name."""
_unpreparable: set[str] = set()
"""SQL the server would not PREPARE (a parameter whose type it cannot tell): bound inline."""
LARGE = 64 * 1024
"""Bytes of a statement's values, or of a message, past which binding or joining them runs in a
thread: a 1 MB state took ~20 ms of the event loop (hex-escaping, copying), stalling every other
run on it; in a thread, the interpreter hands the loop its turn every few milliseconds."""
PREPARE_REFUSED = frozenset({"42P18", "42804", "42P08", "42725"})
"""What a PREPARE of a statement whose parameters' types the server cannot settle raises
(indeterminate or mismatched datatype, ambiguous parameter or function)."""
PREPARED_LOST = "26000"
"""An EXECUTE of a name the session no longer has: something deallocated the connection's
prepared statements behind this module's back (psycopg sends DEALLOCATE ALL when a transaction
rolls back on a connection where it had prepared statements of its own; a pooler's reset
would too). The transaction ran nothing: it is sent again, preparing afresh."""


def forget_prepared(conn: AsyncConnection[Any]) -> None:
    """The connection's prepared statements are unknown (a message failed after some ran)."""
    _prepared.pop(conn, None)


def _quoting(conn: AsyncConnection[Any]) -> Transformer:
    """The connection's transformer, made once: a new one per transaction looked up the
    dumper of each type of value again (8.5 of a 5-step run's 47 us of binding per
    transaction, measured on its 12 transactions' statements). Kept on
    the connection itself, a cycle the collector frees with it: a mapping keyed by the
    connection would keep it alive through the transformer's reference to it. A connection
    runs one transaction at a time, so one transformer serves them in turn."""
    found: Transformer | None = conn.__dict__.get("_keel_quoting")
    if found is None:
        found = conn.__dict__["_keel_quoting"] = adapt.Transformer(conn)
    return found


def _size(params: Any) -> int:
    """Bytes of the bytes and strings among a statement's values: upstream's blobs, and the
    strings inside its JSON values (the official saver keeps a checkpoint's str, int, float and
    bool channel values inline in its JSONB, so a 1 MB string state is dumped with it)."""
    return _sum(params.values() if isinstance(params, dict) else params or ())


_FLAT = frozenset({int, float, bool, type(None)})


def _sum(values: Any) -> int:
    # Every statement of every step passes here: exact types first, the general case after.
    total = 0
    for value in values:
        kind = type(value)
        if kind is str or kind is bytes:
            total += len(value)
        elif kind not in _FLAT:
            total += _bytes_of(value)
    return total


def _bytes_of(value: Any) -> int:
    if isinstance(value, bytes | bytearray | memoryview | str):
        return len(value)
    if isinstance(value, Json | Jsonb):
        value = value.obj
    if isinstance(value, dict):
        inline = value.get("channel_values")
        if type(inline) is dict:
            # A checkpoint: what can be large in it is the channel values upstream keeps
            # inline (str, int, float, bool). Its versions grow with the number of channels,
            # not with what they hold: not walked, step after step.
            return _sum(inline.values())
        return _sum(value.values())
    if isinstance(value, list | tuple):
        return _sum(value)
    return 0


@functools.lru_cache(maxsize=512)
def _numbered(sql: str) -> tuple[str, tuple[str | int, ...]]:
    """`sql` with psycopg's placeholders as $1, $2, ... and what each number binds (a name of
    a mapping's key, or a position). Memoised: a step binds the same few statements over and
    over."""
    keys: list[str | int] = []
    numbers: dict[str | int, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(0) == "%%":
            return "%"
        key: str | int = match.group("name") or len(keys)
        if key not in numbers:
            keys.append(key)
            numbers[key] = len(keys)
        return f"${numbers[key]}"

    return _PLACEHOLDER.sub(number, sql), tuple(keys)


class Batch:
    """One transaction's statements, sent together as one simple-query message: at the end,
    or when a row is needed before it (`one`, `all`, a `send`'s row read early)."""

    pipelined = True

    def __init__(self, conn: AsyncConnection[DictRow], queries: dict[str, str]) -> None:
        self.connection = conn
        self._queries = queries
        # Each value quoted by psycopg's own adapters, as `mogrify` would, without parsing a
        # placeholder list per statement; the message is built as bytes, never decoded and
        # encoded again.
        self._adapt = _quoting(conn)
        self._literal = self._adapt.as_literal
        self._encoding = conn.info.encoding
        self._known = _prepared.setdefault(conn, {})
        self._preparing: dict[str, str] = {}
        self.prepares = 0
        """Statements this batch PREPAREd (for its caller: a refused one is retried inline)."""
        self._pending: list[bytes] = []
        self._wanted: dict[int, list[Row | None]] = {}
        self._begun = False

    def add(self, sql: str, params: Any = None) -> int:
        if params is None:
            self._pending.append(sql.encode(self._encoding))
        elif sql in _unpreparable:
            # Rare (a statement the server would not PREPARE): a cursor only for these.
            binder = psycopg.AsyncClientCursor(self.connection)
            self._pending.append(binder.mogrify(sql, params).encode(self._encoding))
        else:
            name = self._known.get(sql) or self._preparing.get(sql)
            converted, keys = _numbered(sql)
            if name is None:
                name = self._preparing[sql] = f"keel_{next(_names)}"
                self._pending.append(f"PREPARE {name} AS {converted}".encode(self._encoding))
                self.prepares += 1
            run = b"EXECUTE " + name.encode()
            if keys:
                literal = self._literal
                values = [params[k] for k in keys]
                bound = b", ".join([b"NULL" if v is None else literal(v) for v in values])
                run += b"(" + bound + b")"
            self._pending.append(run)
        return len(self._pending) - 1

    def refused(self) -> None:
        """The server would not PREPARE one of this batch's statements: bind them inline."""
        _unpreparable.update(self._preparing)

    async def flush(self, *, end: bool = False, rows_of: int | None = None) -> list[Row]:
        """Send what is pending; the rows of pending statement `rows_of` (the others' rows go
        to their `send` slots, or nowhere: a step's writes return nothing anyone reads).
        Before the end, the message opens the transaction (BEGIN) for the next one; at the end
        it commits it."""
        statements, wanted = self._pending, self._wanted
        self._pending, self._wanted = [], {}
        offset = 0
        if not end and not self._begun:
            statements.insert(0, b"BEGIN")
            offset, self._begun = 1, True
        elif end and self._begun:
            statements.append(b"COMMIT")
        if not statements:
            return []
        keep = {index + offset for index in wanted}
        if rows_of is not None:
            keep.add(rows_of + offset)
        if sum(map(len, statements)) > LARGE:
            message = await asyncio.to_thread(b";\n".join, statements)
        else:
            message = b";\n".join(statements)
        try:
            results = await self._send(message)
        except BaseException:
            # A PREPARE before the failed statement ran (PREPARE is not transactional), one
            # after it did not: which of them exist is unknown, so none is taken as known.
            forget_prepared(self.connection)
            self._known = _prepared.setdefault(self.connection, {})
            raise
        self._known.update(self._preparing)
        self._preparing = {}
        found = {i: self._rows(results[i]) for i in keep if i < len(results)}
        for index, slot in wanted.items():
            rows = found.get(index + offset, [])
            slot.append(rows[0] if rows else None)
        return found.get(rows_of + offset, []) if rows_of is not None else []

    async def _send(self, message: bytes) -> list[PGresult]:
        """The message's results, one per statement, straight from libpq, as psycopg's cursor
        gets them; errors raised as the cursor raises them. The cursor would then wrap each
        result in bookkeeping of its own (a current result set per statement, a
        prepared-statement cache lookup per text) for rows nobody reads: 2-3% of a 5-step run,
        measured interleaved."""
        conn = self.connection
        conn.pgconn.send_query(message)
        results: list[PGresult] = await conn.wait(generators.execute(conn.pgconn))
        for result in results:
            if result.status == ExecStatus.FATAL_ERROR:
                raise errors.error_from_result(result, encoding=self._encoding)
        return results

    def _rows(self, result: PGresult) -> list[Row]:
        if result.status != ExecStatus.TUPLES_OK or not result.ntuples:
            return []
        self._adapt.set_pgresult(result)  # its loaders; quoting values does not read them
        names = [(result.fname(i) or b"").decode(self._encoding) for i in range(result.nfields)]
        rows: list[Row] = self._adapt.load_rows(
            0, result.ntuples, lambda values: dict(zip(names, values, strict=True))
        )
        self._adapt.set_pgresult(None)  # the transformer outlives the batch: not its rows
        return rows

    async def _now(self, name: str, params: Params | None) -> list[Row]:
        index = self.add(self._queries[name], params or {})
        return await self.flush(rows_of=index)

    async def one(self, name: str, params: Params | None = None) -> Row | None:
        rows = await self._now(name, params)
        return rows[0] if rows else None

    async def all(self, name: str, params: Params | None = None) -> list[Row]:
        return await self._now(name, params)

    async def execute(self, name: str, params: Params | None = None) -> int:
        # Sent with the message: nothing in a step transaction reads a row count.
        self.add(self._queries[name], params or {})
        return -1

    async def script(self, sql: str) -> None:
        raise RuntimeError("DDL does not run in a step transaction")

    async def send(self, name: str, params: Params | None = None) -> Later:
        slot: list[Row | None] = []
        self._wanted[self.add(self._queries[name], params or {})] = slot

        async def later() -> Row | None:
            if not slot:  # read before the end: what is pending goes now (BEGIN first)
                await self.flush()
            return slot[0] if slot else None

        return later

    async def replay(self, statement: Statement) -> None:
        sql, params, many = statement
        for one in params if many else (params,):
            if _size(one) > LARGE:
                await asyncio.to_thread(self.add, sql, one)
            else:
                self.add(sql, one)
