"""SQLite's write-ahead log: a reader holding it back is named in a warning, and the WAL file
shrinks back to nothing once that reader is gone and the database is quiet.

A read transaction keeps the frames after its snapshot in the WAL: no checkpoint may fold
them, so the WAL grows with every commit (a review measured 120 MB after 60 s of one reader).
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import keel
from keel.backends.locks import TaskReentrantLock
from keel.backends.sqlite_wal import JOURNAL_SIZE_LIMIT, WalKeeper
from tests.support.graphs import echo_graph

AppFactory = Callable[..., keel.App]
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"])

IDLE = 0.2
"""Seconds without a write after which Keel truncates the WAL (5 s outside tests)."""
WARN_AFTER = 0.5
"""Seconds a reader holds checkpoints back before the warning (60 s outside tests)."""


def _wait_for(done: Callable[[], bool], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _app(make_app: AppFactory) -> keel.App:
    app = make_app(max_input_bytes=1_000_000)
    app.workflow("echo")(echo_graph)
    rt = app.aio.runtime
    rt.portal.call(rt.open())
    wal = rt.connector.wal  # type: ignore[attr-defined]
    wal.fold_every = 256 * 1024  # a fold every few runs, not every 4 MiB
    wal.idle_after = IDLE
    wal.warn_after = WARN_AFTER
    return app


def _burst(app: keel.App, prefix: str, runs: int = 8) -> None:
    for i in range(runs):
        app.submit("echo", job_id=f"{prefix}-{i}", input={"text": "x" * 50_000})
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert all(r["status"] == "completed" for r in app.list_runs(limit=runs))


def _blocked(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "sqlite.wal_blocked"]


@sqlite_only
def test_a_reader_holding_the_wal_back_is_warned_about_and_the_wal_shrinks_after_it(
    make_app: AppFactory, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keel.store")
    app = _app(make_app)
    path = db_url.removeprefix("sqlite:///")
    wal_file = Path(f"{path}-wal")
    _burst(app, "before")  # frames the reader's snapshot will not need
    reader = sqlite3.connect(path, isolation_level=None)  # a `sqlite3` shell left open
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM keel_runs").fetchone()
        _burst(app, "held")
        # Held back for longer than `warn_after`: the folds and the idle truncations say so.
        assert _wait_for(lambda: bool(_blocked(caplog))), "no sqlite.wal_blocked warning"
        warning = _blocked(caplog)[0]
        assert warning.levelno == logging.WARNING
        assert warning.name == "keel.store"
        held = warning.event_data["held_seconds"]  # type: ignore[attr-defined]
        assert held >= WARN_AFTER
        message = warning.getMessage()
        assert "a reader has held back checkpoints for" in message, message
        assert re.search(r"held back checkpoints for \d+(\.\d)? s", message), message
        assert "SQLite WAL at " in message and " MB" in message, message
        assert warning.event_data["wal_bytes"] > 256 * 1024  # type: ignore[attr-defined]
        # The truncations tried meanwhile never wait on the reader: the connection (and the
        # lock every use of it takes) stays free for Keel's own work.
        for _ in range(8):
            start = time.monotonic()
            app.list_runs(limit=1)
            assert time.monotonic() - start < 2.0
            time.sleep(IDLE / 2)
        # Not once per fold or truncation: at most one per `warn_every` (300 s) while it lasts.
        assert len(_blocked(caplog)) == 1, [r.getMessage() for r in _blocked(caplog)]
        grown = wal_file.stat().st_size
        assert grown > 256 * 1024, grown
    finally:
        reader.close()
    # The reader gone and nothing written since: the WAL file is cut back to nothing, without
    # a restart, and a line says the checkpoints caught up.
    assert _wait_for(lambda: wal_file.stat().st_size == 0), wal_file.stat().st_size

    def unblocked() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", None) == "sqlite.wal_unblocked"]

    assert _wait_for(lambda: bool(unblocked()))  # logged on the loop, just after the truncation
    assert len(unblocked()) == 1, unblocked()
    # The database is whole: the runs written while the reader held on are there.
    assert len(app.list_runs(limit=100)) == 16


@sqlite_only
def test_an_idle_database_truncates_its_wal(make_app: AppFactory, db_url: str) -> None:
    """Without any reader: the WAL a burst left behind goes once the database is quiet."""
    app = _app(make_app)
    wal_file = Path(f"{db_url.removeprefix('sqlite:///')}-wal")
    app.submit("echo", job_id="one", input={"text": "x" * 50_000})
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert _wait_for(lambda: os.path.exists(wal_file) and wal_file.stat().st_size == 0)


@sqlite_only
def test_keels_connection_bounds_the_wal_it_keeps(make_app: AppFactory) -> None:
    app = _app(make_app)
    rt = app.aio.runtime

    async def pragmas() -> tuple[Any, Any]:
        conn = rt.connector.connection  # type: ignore[attr-defined]
        limit = await (await conn.execute("PRAGMA journal_size_limit")).fetchone()
        auto = await (await conn.execute("PRAGMA wal_autocheckpoint")).fetchone()
        return limit[0], auto[0]

    limit, auto = rt.portal.call(pragmas())
    assert limit == JOURNAL_SIZE_LIMIT == 64 * 1024 * 1024
    assert auto == 0  # Keel folds the WAL itself, on the database thread


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_warning_comes_once_per_interval_and_a_line_says_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="keel.store")
    keeper = WalKeeper(_no_connection, TaskReentrantLock(), path="x.db", busy_timeout_ms=0)
    clock = _Clock()
    keeper.clock, keeper.warn_after, keeper.warn_every = clock, 60.0, 300.0

    def fold(frames: int, folded: int, seconds_later: float) -> list[str]:
        clock.now += seconds_later
        caplog.clear()
        keeper._observe((0, frames, folded), frames * 4120)
        return [str(getattr(r, "event", "")) for r in caplog.records]

    assert fold(1000, 1000, 0) == []  # all folded
    assert fold(2000, 1200, 1) == []  # a reader: since now
    assert fold(3000, 1200, 30) == []  # 30 s: a long query, not yet a problem
    assert fold(4000, 1200, 31) == ["sqlite.wal_blocked"]  # 61 s
    assert "for 61 s" in caplog.records[0].getMessage()
    assert "SQLite WAL at 16.5 MB" in caplog.records[0].getMessage()
    assert fold(5000, 1200, 60) == []  # not on every fold
    assert fold(6000, 1200, 239) == []
    assert fold(7000, 1200, 1) == ["sqlite.wal_blocked"]  # 300 s after the first
    assert fold(7000, 7000, 5) == ["sqlite.wal_unblocked"]
    assert fold(8000, 7500, 1) == []  # a new reader: a new count
    assert fold(9000, 7500, 59) == []
    # The WAL restarted from its beginning meanwhile: everything was folded, then a new
    # reader came; never warned about, nothing to say it ended.
    assert fold(200, 100, 30) == []
    assert fold(300, 100, 59) == []
    assert fold(400, 100, 2) == ["sqlite.wal_blocked"]


def _no_connection() -> Any:
    raise AssertionError("no connection in this test")
