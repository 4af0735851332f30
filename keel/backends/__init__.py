"""Database connectors: the SQLite and PostgreSQL implementations of `keel.core.store.base`."""

from __future__ import annotations

from keel.core import logs
from keel.core.errors import UsageError
from keel.core.store.base import Connector


def redact(url: str) -> str:
    """A database URL without its password (and any other known secret), fit for a terminal,
    a log or an error message: the one redaction rule of keel.core.logs."""
    return logs.redact(url)


def connect(url: str, *, lease_ttl: float = 30.0) -> Connector:
    """The connector for `url`. PostgreSQL bounds its connections and round trips by
    `lease_ttl` (keel.backends.postgres): a worker on a dead path lets its leases go."""
    if url.startswith("sqlite:"):
        from keel.backends.sqlite import SqliteConnector

        return SqliteConnector(url)
    if url.startswith(("postgresql:", "postgres:", "postgresql+psycopg:")):
        from keel.backends.postgres import PostgresConnector

        return PostgresConnector(url, lease_ttl=lease_ttl)
    raise UsageError(
        f"unsupported database URL {redact(url)!r}: use sqlite:///path or postgresql://..."
    )
