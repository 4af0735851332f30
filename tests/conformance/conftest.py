"""A Keel runtime whose fenced saver the conformance suite writes through, per backend.

The suite's tests each write under fresh thread ids, and upstream runs a whole capability on
one saver and one database; so does this folder: one migrated database per backend and module
(a SQLite file, or a throwaway PostgreSQL database copied from the session's migrated template,
as tests/conftest.py's `db_url` does per test), one runtime, one saver.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import pytest
from langgraph.checkpoint.conformance import checkpointer_test
from langgraph.checkpoint.conformance.initializer import RegisteredCheckpointer

import keel
from keel.langgraph.savers import FencedSaver
from keel.testing.postgres import drop_database
from tests.conformance.adapter import LEASE_TTL, leasing

T = TypeVar("T")

# As in tests/conftest.py, whose session fixture `pg_template` migrates the template.
PG_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "postgresql://keel:keel@127.0.0.1:5432/keel")


@dataclass
class Conformance:
    backend: str
    app: keel.App
    saver: FencedSaver
    """Keel's fenced saver, opened by the runtime, with the adapter's admit-and-claim hook."""
    registered: RegisteredCheckpointer
    """The saver registered the way the suite documents (`@checkpointer_test`), for validate()."""

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the App's event loop, where the saver's connections live."""
        return self.app.aio.runtime.portal.call(coro)


Opener = Callable[[str, "str | None"], Conformance]


@contextmanager
def _database(backend: str, template: str | None, tmp: pytest.TempPathFactory) -> Iterator[str]:
    if template is None:
        url = f"sqlite:///{tmp.mktemp('conformance')}/keel.db"
        with keel.App(url) as app:
            app.migrate()
        yield url
        return
    name = f"keel_conformance_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY WAL_LOG')
    try:
        yield f"{PG_URL.rpartition('/')[0]}/{name}"
    finally:
        drop_database(PG_URL, name)


@contextmanager
def _runtime(
    backend: str, template: str | None, tmp: pytest.TempPathFactory
) -> Iterator[Conformance]:
    with _database(backend, template, tmp) as url:
        app = keel.App(url, lease_ttl=LEASE_TTL, artifacts_dir=tmp.mktemp("artifacts"))
        try:
            runtime = app.aio.runtime
            runtime.portal.call(runtime.open())
            saver = leasing(runtime.fencing())

            @checkpointer_test(name=f"keel-fenced-{backend}")
            async def fenced_saver() -> AsyncIterator[FencedSaver]:
                # The runtime's saver for every capability, as for every spec test: a second
                # saver on the same connection would only repeat what Runtime.open does.
                yield saver

            yield Conformance(backend, app, saver, fenced_saver)
        finally:
            app.close()


@pytest.fixture(scope="module")
def _runtimes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Opener]:
    opened: dict[str, Conformance] = {}
    with ExitStack() as stack:

        def get(backend: str, template: str | None) -> Conformance:
            if backend not in opened:
                opened[backend] = stack.enter_context(_runtime(backend, template, tmp_path_factory))
            return opened[backend]

        yield get


@pytest.fixture
def conformance(backend: str, _runtimes: Opener, request: pytest.FixtureRequest) -> Conformance:
    """The module's runtime for the test's backend, opened at its first test."""
    # pg_template skips the test (or fails it, in CI) without a server.
    template = request.getfixturevalue("pg_template") if backend == "postgres" else None
    return _runtimes(backend, template)
