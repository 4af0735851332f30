"""Database connectors: the SQLite and PostgreSQL implementations of `keel.core.store.base`."""

from __future__ import annotations

from keel.core.errors import UsageError
from keel.core.store.base import Connector


def connect(url: str) -> Connector:
    if url.startswith("sqlite:"):
        from keel.backends.sqlite import SqliteConnector

        return SqliteConnector(url)
    if url.startswith(("postgresql:", "postgres:", "postgresql+psycopg:")):
        from keel.backends.postgres import PostgresConnector

        return PostgresConnector(url)
    raise UsageError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")
