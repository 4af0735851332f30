"""Is the database there, reachable and migrated? Asked before a command touches it and by the
service's readiness probe, without creating anything and without waiting long.

Reading an SQLite file that is not there would create an empty one; a PostgreSQL server that
refuses connections would keep the pool retrying for 15 s before saying why. So the checks
here look at the file, or open one plain connection with a short timeout, first.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from keel.backends import redact as redact
from keel.core.errors import KeelError, SchemaMismatch
from keel.runtime.app import App
from keel.runtime.runtime import Runtime


class DatabaseUnavailable(KeelError):
    """The database does not answer."""


class NoDatabase(DatabaseUnavailable):
    """There is no database where the URL points."""


def check_file(url: str) -> None:
    """NoDatabase if `url` names an SQLite file that does not exist (other URLs pass)."""
    if not url.startswith("sqlite:"):
        return
    from keel.backends.sqlite import sqlite_path

    path = sqlite_path(url)
    if path != ":memory:" and not Path(path).exists():
        raise NoDatabase(f"no database file at {path}: run `keel migrate` first")


def check_database(url: str, *, existing: bool = True) -> None:
    """Fail fast and clearly where the database is missing (`existing`) or unreachable."""
    if url.startswith("sqlite:"):
        if existing:
            check_file(url)
        return
    import psycopg

    from keel.backends.postgres import normalize_postgres_url

    try:
        psycopg.connect(normalize_postgres_url(url), connect_timeout=5).close()
    except psycopg.Error as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip()
        raise DatabaseUnavailable(f"cannot connect to {redact(url)}: {redact(reason)}") from None


@dataclass(frozen=True)
class SchemaState:
    """What a readiness probe found: `reason` is None when the database is ready."""

    database: str
    expected: int
    current: int | None
    reason: str | None

    @property
    def ready(self) -> bool:
        return self.reason is None


def schema_state(app: App, timeout: float) -> SchemaState:
    """Whether `app`'s database answers within `timeout` seconds at the schema this Keel needs."""
    rt = app.aio.runtime
    expected = rt.latest_schema_version
    current: int | None = None
    reason: str | None = None
    try:
        check_file(rt.url)
        current, reason = rt.portal.call(asyncio.wait_for(_probe(rt), timeout))
    except TimeoutError:
        reason = f"the database did not answer within {timeout:g} s"
    except Exception as exc:
        text = str(exc).strip()
        reason = text.splitlines()[0] if text else type(exc).__name__
    return SchemaState(rt.dialect, expected, current, reason)


async def _probe(rt: Runtime) -> tuple[int, str | None]:
    current = await rt.schema_version()
    if current == rt.latest_schema_version:
        return current, None
    try:
        # The store words the mismatch (and its remedy) for every caller alike.
        await rt.check_schema()
    except SchemaMismatch as exc:
        return current, str(exc)
    return rt.latest_schema_version, None  # migrated since the first read
