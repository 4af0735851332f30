"""One backend fixture for every store-touching test: SQLite files and a real PostgreSQL.

PostgreSQL tests use $KEEL_TEST_POSTGRES_URL (default: the role `.ci/run` creates). Each test
gets its own database, copied from a migrated template. Without a server they are skipped and
the run says so at the end; with KEEL_REQUIRE_POSTGRES=1 (as in CI) they fail instead.

The folders under tests/ are tiers (tests/README.md): they run cheapest first, and the run ends
with one line per tier saying how many tests passed (failed, ...) and how long it took.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import keel
from keel.testing.postgres import drop_database

# Effects that declare no timeout get this one in the tests' apps (60 s by default): a key left
# pending by a test's crash is reconciled once its call's deadline has passed, seconds later.
os.environ.setdefault("KEEL_EFFECT_TIMEOUT", "2")
# pytest-xdist's workers (make test) inherit COLUMNS=80 and LINES=24 from execnet, which a run
# on one process does not have: the CLI would render its tables 80 wide instead of the 160 it
# uses when piped, here and in the subprocesses the tests start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

PG_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "postgresql://keel:keel@127.0.0.1:5432/keel")
REQUIRE_PG = os.environ.get("KEEL_REQUIRE_POSTGRES") == "1"
_pg_problem: list[str] = []

TIERS = ("unit", "store", "conformance", "runtime", "interfaces", "examples", "tools", "processes")
"""The folders of tests/, cheapest first: the order they run in (any other folder runs last)."""
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
_seconds: Counter[str] = Counter()


def _with_db(url: str, dbname: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{dbname}"


def _admin() -> psycopg.Connection[Any]:
    return psycopg.connect(PG_URL, autocommit=True, connect_timeout=3)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    try:
        with _admin() as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        reason = f"PostgreSQL unreachable at {PG_URL}: {str(exc).strip().splitlines()[0]}"
        _pg_problem.append(reason)
        if REQUIRE_PG:
            pytest.fail(f"{reason} (KEEL_REQUIRE_POSTGRES=1)")
        pytest.skip(reason)
    name = f"keel_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    drop_database(PG_URL, name)
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    with keel.App(_with_db(PG_URL, name)) as app:
        app.migrate()
    yield name
    drop_database(PG_URL, name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file that each test's database is a copy of: a copy takes well under a
    millisecond, a migration (its DDL and fsyncs) 50 to 300 ms, once for every SQLite test."""
    path = tmp_path_factory.mktemp("template") / "keel.db"
    with keel.App(f"sqlite:///{path}") as app:
        app.migrate()
    # Closed: SQLite folded its write-ahead log into the file, which is now the whole database.
    assert not path.with_name("keel.db-wal").exists()
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A migrated, empty Keel database of the test's backend."""
    if backend == "sqlite":
        shutil.copyfile(request.getfixturevalue("sqlite_template"), tmp_path / "keel.db")
        yield f"sqlite:///{tmp_path}/keel.db"
        return
    template = request.getfixturevalue("pg_template")
    name = f"keel_t_{uuid.uuid4().hex[:12]}"
    # WAL_LOG (PostgreSQL 15's default) copies the small template through the WAL; FILE_COPY
    # forces two server-wide checkpoints, which cost a busy server half a second per test.
    with _admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY WAL_LOG')
    yield _with_db(PG_URL, name)
    drop_database(PG_URL, name)


@pytest.fixture
def make_app(db_url: str, tmp_path: Path) -> Iterator[Callable[..., keel.App]]:
    """Build Apps on the test database; each is closed when the test ends."""
    apps: list[keel.App] = []

    def make(**kwargs: Any) -> keel.App:
        kwargs.setdefault("artifacts_dir", tmp_path / "artifacts")
        app = keel.App(db_url, **kwargs)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


def tier_of(nodeid: str) -> str:
    """`tests/store/test_fencing.py::test_x` -> `store`."""
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0] or "other"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Cheapest first, so that `-x` stops at a broken rule in seconds; stable within a tier.
    rank = {tier: n for n, tier in enumerate(TIERS)}
    items.sort(key=lambda item: rank.get(tier_of(item.nodeid), len(TIERS)))


HUNG_AFTER = 600.0
"""Seconds one test (setup, call, teardown) may take before the run prints every thread's stack
and exits. pytest-timeout's signal fails a slow test, but cannot end a deadlock in C (a thread
holding the GIL waiting for a lock held by one waiting for the GIL), nor a teardown that hangs
after it fired: a hung run would otherwise spend CI's whole budget and print nothing useful."""


_terminal: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    # Output capture is off here: this is the terminal's stderr, where the stacks must go (a
    # captured test's stderr is a file the exit would throw away).
    _terminal.append(os.fdopen(os.dup(2), "w"))


_deadline: list[float] = [0.0]


def _arm(seconds: float) -> None:
    faulthandler.dump_traceback_later(max(seconds, 1.0), exit=True, file=_terminal[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _deadline[0] = time.monotonic() + HUNG_AFTER
    _arm(HUNG_AFTER)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_exception_interact(node: pytest.Item, call: Any, report: Any) -> None:
    # pytest's own faulthandler plugin cancels the (one, process-wide) timer at every failure,
    # pytest-timeout's among them: armed again for what is left, so that a teardown hanging
    # after a failure still ends the run. Not under --pdb: a debugging session may take long.
    if not node.config.getoption("usepdb"):
        _arm(_deadline[0] - time.monotonic())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[tier_of(report.nodeid)] += report.duration  # setup, call and teardown


def tier_lines(stats: dict[str, list[Any]]) -> list[str]:
    """`tier store: 180 passed, 2 skipped in 95.3 s`, one per tier that ran, in run order."""
    counts: dict[str, Counter[str]] = {}
    for outcome in OUTCOMES:
        for report in stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if nodeid:
                counts.setdefault(tier_of(nodeid), Counter())[outcome] += 1
    rank = {tier: n for n, tier in enumerate(TIERS)}
    width = max((len(tier) for tier in counts), default=0)
    lines = []
    for tier in sorted(counts, key=lambda t: (rank.get(t, len(TIERS)), t)):
        said = ", ".join(f"{counts[tier][o]} {o}" for o in OUTCOMES if counts[tier][o])
        lines.append(f"tier {tier + ':':<{width + 1}} {said} in {_seconds[tier]:.1f} s")
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = tier_lines(terminalreporter.stats)
    if lines:
        terminalreporter.write_sep("=", "time by tier")
        for line in lines:
            terminalreporter.write_line(line)
    if _pg_problem:
        terminalreporter.write_sep("!", "PostgreSQL suite SKIPPED", yellow=True)
        terminalreporter.write_line(_pg_problem[0])
        terminalreporter.write_line("Start a server and set KEEL_TEST_POSTGRES_URL to run it.")
    else:
        passed = [r for r in terminalreporter.stats.get("passed", []) if "postgres" in r.keywords]
        terminalreporter.write_line(f"PostgreSQL tests passed: {len(passed)}")
