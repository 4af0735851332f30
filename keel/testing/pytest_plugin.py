"""pytest fixtures for testing your own Keel workflows (loaded automatically once Keel is
installed, through the `pytest11` entry point).

- `keel_db`: a migrated, throwaway SQLite database URL.
- `keel_postgres_db`: the same on the PostgreSQL server at $KEEL_TEST_POSTGRES_URL (skipped if
  unreachable, failed if KEEL_REQUIRE_POSTGRES=1).
- `keel_smtp_sink`, `keel_http_sink`: real servers on 127.0.0.1 that count what they received.
- `keel_chaos` (from keel.chaos.pytest_plugin): the crash matrix as a function returning its
  report.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import keel
from keel.testing.http import HttpSink
from keel.testing.postgres import drop_database
from keel.testing.smtp import SmtpSink


@pytest.fixture
def keel_db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/keel-test.db"
    with keel.App(url) as app:
        app.migrate()
    return url


@pytest.fixture
def keel_postgres_db() -> Iterator[str]:
    import psycopg

    server = os.environ.get("KEEL_TEST_POSTGRES_URL", "postgresql://keel:keel@127.0.0.1/keel")
    try:
        admin = psycopg.connect(server, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if os.environ.get("KEEL_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL unreachable at {server}: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {server}")
    name = f"keel_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{server.rsplit('/', 1)[0]}/{name}"
    with keel.App(url) as app:
        app.migrate()
    yield url
    drop_database(server, name)


@pytest.fixture
def keel_smtp_sink(tmp_path: Path) -> Iterator[SmtpSink]:
    with SmtpSink(spool=tmp_path / "keel-smtp-spool") as sink:
        yield sink


@pytest.fixture
def keel_http_sink() -> Iterator[HttpSink]:
    with HttpSink() as sink:
        yield sink
