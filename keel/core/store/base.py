"""The backend seam: a connector runs named queries; everything else talks to it.

SQL lives in `sql/<dialect>/queries.sql`, one statement per `-- name: x` header, the same names
in every dialect (a test enforces it); a statement that writes a run's status declares its
moves in a `-- moves: a>b` line (`parse_moves`). Migrations live in
`sql/<dialect>/migrations/NNNN_*.sql`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
Row = dict[str, Any]
Params = dict[str, Any]

_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
_MOVES = re.compile(r"^-- moves: (.*)$", re.MULTILINE)

Move = tuple[str, str]
"""A change of a run's status, (from, to); from is `new` for an admission
(`keel.core.lifecycle.NEW`)."""


def queries_text(dialect: str) -> str:
    return (resources.files("keel.core.store") / "sql" / dialect / "queries.sql").read_text()


def _sections(text: str) -> list[tuple[str, str]]:
    """(name, body with its comment lines) per `-- name:` header, in the file's order."""
    parts = _HEADER.split(text)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def parse_queries(text: str) -> dict[str, str]:
    """The statements of a queries.sql text by name, without their comment lines."""
    queries: dict[str, str] = {}
    for name, body in _sections(text):
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def parse_moves(text: str) -> dict[str, frozenset[Move]]:
    """The status moves each query declares in its `-- moves: a>b, c>d` header line: the
    queries that write `keel_runs.status` say which moves they make (a unit test holds them
    against `keel.core.lifecycle.TRANSITIONS`, and against the SQL that writes the column)."""
    declared: dict[str, frozenset[Move]] = {}
    for name, body in _sections(text):
        found = _MOVES.search(body)
        if found is None:
            continue
        pairs = [item.strip().split(">") for item in found.group(1).split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"query {name}: a move is written from>to, not {found.group(1)!r}")
        declared[name] = frozenset((src.strip(), dst.strip()) for src, dst in pairs)
    return declared


def load_queries(dialect: str) -> dict[str, str]:
    return parse_queries(queries_text(dialect))


def load_moves(dialect: str) -> dict[str, frozenset[Move]]:
    return parse_moves(queries_text(dialect))


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def load_migrations(dialect: str) -> list[Migration]:
    folder = resources.files("keel.core.store") / "sql" / dialect / "migrations"
    found = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        version = int(entry.name.split("_", 1)[0])
        body = "\n".join(
            line for line in entry.read_text().splitlines() if not line.lstrip().startswith("--")
        )
        found.append(Migration(version, entry.name.removesuffix(".sql"), split_statements(body)))
    return sorted(found, key=lambda m: m.version)


def split_statements(body: str) -> tuple[str, ...]:
    """A migration's statements: split at `;`, except inside a `$$`-quoted function body."""
    statements, current = [], ""
    for i, piece in enumerate(body.split("$$")):
        if i % 2:  # the body of a function: its semicolons are its own
            current += f"$${piece}$$"
            continue
        first, *rest = piece.split(";")
        current += first
        for chunk in rest:
            statements.append(current)
            current = chunk
    statements.append(current)
    whole: list[str] = []
    for statement in (s.strip() for s in statements if s.strip()):
        if whole and _open_trigger(whole[-1]):
            whole[-1] += ";\n" + statement  # a SQLite trigger's body: BEGIN ...; END
        else:
            whole.append(statement)
    return tuple(whole)


def _open_trigger(statement: str) -> bool:
    """A SQLite `CREATE TRIGGER ... BEGIN` whose `END` is still to come."""
    upper = statement.upper()
    return (
        upper.startswith("CREATE TRIGGER")
        and re.search(r"\bBEGIN\b", upper) is not None
        and re.search(r"\bEND$", upper) is None
    )


Later = Callable[[], Awaitable["Row | None"]]
"""The row of a statement sent with `Tx.send`, read once the transaction has committed."""

EndWith = Callable[[Callable[["Tx"], Awaitable[Later]]], Awaitable["Row | None"]]
"""Runs an execution's end statement (the callable given to it adds it to a transaction) in the
transaction of something held back until the end, its last step's checkpoint: the end's row,
or None if it wrote nothing."""

writing: ContextVar[int] = ContextVar("keel_transaction_bytes", default=0)
"""Bytes of values the transaction about to run writes, set by a caller that knows them (a
step's): SQLite commits a bulky one on its database thread, never on the event loop's, and
counts them towards its next WAL checkpoint (`SqliteConnector`)."""
BULKY = 64 * 1024
"""Bytes of values past which a transaction is bulky."""

Statement = tuple[str, Any, bool]
"""A statement of LangGraph's savers, recorded to run in Keel's transaction: its SQL, its
parameters and whether it runs once per parameter set (executemany)."""


class Tx(Protocol):
    """Named queries inside one transaction (or one read)."""

    pipelined: bool
    """Whether `send` queues its statement to go with the rest of the transaction (PostgreSQL's
    step transaction: one message) rather than running it now (SQLite): a caller may then
    read a sent statement's row before deciding on the next without costing a round trip."""

    async def one(self, name: str, params: Params | None = None) -> Row | None: ...

    async def all(self, name: str, params: Params | None = None) -> list[Row]: ...

    async def execute(self, name: str, params: Params | None = None) -> int: ...

    async def script(self, sql: str) -> None:
        """Run raw DDL (migrations only)."""
        ...

    async def send(self, name: str, params: Params | None = None) -> Later:
        """Send a statement without waiting for its row (a pipelined transaction keeps going,
        and stops at its commit if the statement failed); await the result for the row."""
        ...

    async def replay(self, statement: Statement) -> None:
        """Run a statement LangGraph's saver issued (recorded, not one of Keel's queries)."""
        ...


class Connector(Protocol):
    dialect: str
    url: str
    notifies: bool
    """Whether `listen` hears other processes' wake-ups (PostgreSQL): idle workers then claim
    when woken, with a slow safety poll, instead of polling."""
    clock_override: Callable[[], float] | None
    """A test clock that `keel_now()` reads on this connector's connections instead of the
    database's own clock (None in production)."""
    shared: bool
    """Whether another connection to `url` reaches this same database (not SQLite's
    `:memory:`)."""

    async def open(self) -> None: ...

    async def attach_saver(
        self, setup: Callable[[], Awaitable[None]], alone: Callable[[], bool]
    ) -> None:
        """Take the open runtime's LangGraph saver: its `setup`, and `alone()`, whether at most
        one execution of this process holds a lease (SQLite sets it up now, as its lazy setup
        would commit Keel's transactions, and commits on the loop's thread while alone)."""

    async def close(self) -> None: ...

    async def make_room(self, runs: int) -> None:
        """Room for `runs` more executions at once on this open connector (a worker starting
        on it; negative: a worker stopping gives its room back): PostgreSQL's pool may then
        hold a connection for each, beside the worker's own loops; SQLite, one connection, has
        nothing to do."""

    def is_transient(self, exc: BaseException) -> bool:
        """True if this one exception (not its chain) is the driver saying the database or its
        connection failed, rather than the statement: see `keel.core.infra`."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Tx]:
        """A write transaction; SQLite takes the write lock at BEGIN (IMMEDIATE)."""
        ...

    def read(self) -> AbstractAsyncContextManager[Tx]:
        """Reads outside a write transaction."""
        ...

    async def single(self, name: str, params: Params | None = None) -> Row | None:
        """Run one named query as its own write transaction, in one round trip (PostgreSQL:
        one statement on an autocommit connection) or one call on the database thread (SQLite).

        On SQLite the query may be a chain of statements (`;` at a line's end): they run in
        order under one BEGIN IMMEDIATE; the columns of each statement's first row become
        parameters of the statements after it, and a statement with a result that returns no
        row ends the chain (what ran before it commits). The answer is the chain's rows merged
        (PostgreSQL: the statement's first row), or None if a statement found nothing."""
        ...

    async def run_transaction(self, body: Callable[[Tx], Awaitable[T]]) -> T:
        """One write transaction as one call: `body` only sends statements through its Tx
        (awaiting nothing else), and the whole transaction costs one hop to SQLite's database
        thread, one pipeline (one round trip) on PostgreSQL."""
        ...

    async def listen(self, channel: str, on_notify: Callable[[str | None], None]) -> None:
        """Call `on_notify(payload)` whenever another process wakes `channel`, and
        `on_notify(None)` whenever it (re)starts listening: anything sent meanwhile was missed
        (returns at once if the database cannot notify)."""
        ...
