"""SQLite's write lock held by another process: the event loop never waits for it.

A transaction that would run on the loop's own thread (one execution in flight) asks for the
lock without SQLite's busy handler; if another connection holds it, the transaction goes to
the database thread, which waits there (busy timeout) while the loop serves everything else.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable

import pytest

import keel
from tests.support.graphs import echo_graph
from tests.support.roundtrips import counting

AppFactory = Callable[..., keel.App]
pytestmark = pytest.mark.parametrize("backend", ["sqlite"])

HELD = 0.5
"""Seconds another connection holds the write lock."""


def test_a_write_lock_held_elsewhere_does_not_stall_the_loop(
    make_app: AppFactory, db_url: str
) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    rt = app.aio.runtime
    rt.portal.call(rt.open())
    locked, released = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # another writer: a second process would hold it the same way
        other = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            locked.set()
            time.sleep(HELD)
            other.execute("COMMIT")
            released.set()
        finally:
            other.close()

    async def submit_while_locked() -> tuple[int, float, list[str]]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.02)
        start = time.monotonic()
        with counting() as count:
            await app.aio.submit("echo", job_id="busy", input={"text": "x"})
        took = time.monotonic() - start
        ticker.cancel()
        return ticks, took, count.kinds

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert locked.wait(5)
    try:
        ticks, took, kinds = rt.portal.call(submit_while_locked())
    finally:
        holder.join()
    assert released.is_set()
    # The admission waited for the lock, on the database thread (its BEGIN on the loop's own
    # thread was refused at once) ...
    assert took >= HELD * 0.5, took
    assert kinds == ["_group"], kinds
    # ... while the loop went on ticking: blocked in SQLite's busy handler, it could not have.
    assert ticks >= 10, ticks
    assert app.list_runs(job_id="busy", limit=1)[0]["status"] == "queued"


def test_a_lone_executions_bulky_step_commits_on_the_database_thread(
    make_app: AppFactory,
) -> None:
    """Alone, an execution's small transactions commit on the loop's thread; the one that
    writes a large state (a 200 KB channel value) goes to the database thread, where writing
    its pages holds no one else's work on the loop."""
    from keel.core import leases

    app = make_app(max_input_bytes=1_000_000)
    app.workflow("echo")(echo_graph)
    rt = app.aio.runtime

    async def run() -> tuple[object, list[str]]:
        await rt.open()
        await app.aio.submit("echo", job_id="bulky", input={"text": "x" * 200_000})
        got = await leases.claim(rt.store, "w-a", rt.workflows.keys(), rt.lease_ttl)
        assert got is not None
        with counting() as count:
            outcome = await rt.executor("w-a").execute(*got)
        return outcome, count.kinds

    outcome, kinds = rt.portal.call(run())
    assert outcome == "completed"
    # The node's step (the input's and START's checkpoints with it, and the end) carries the
    # 200 KB text twice: the thread's; nothing else was written.
    assert kinds == ["_group"], kinds


def test_the_wal_is_checkpointed_on_the_database_thread(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keel's connection never checkpoints inside a commit (`wal_autocheckpoint=0`: that
    commit may run on the loop's thread); past SQLite's own threshold it folds the WAL into
    the database on the database thread, so the WAL's frames are reused, not grown without
    end."""
    from keel.backends import sqlite as backend

    app = make_app(max_input_bytes=1_000_000)
    app.workflow("echo")(echo_graph)
    rt = app.aio.runtime
    rt.portal.call(rt.open())
    conn = rt.connector.connection._conn  # type: ignore[attr-defined]
    assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    folds: list[tuple[str, int]] = []
    fold = backend._checkpoint

    def watched(connection: sqlite3.Connection) -> None:
        fold(connection)
        # (busy, frames in the WAL, frames folded): all of them, on the database thread.
        _, frames, folded = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        folds.append((threading.current_thread().name, frames - folded))

    monkeypatch.setattr(backend, "_checkpoint", watched)
    runs = backend.WAL_CHECKPOINT_BYTES // 200_000 + 2
    for i in range(runs):
        app.submit("echo", job_id=f"wal-{i}", input={"text": "x" * 100_000})
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert all(r["status"] == "completed" for r in app.list_runs(limit=runs))
    loop_thread = rt.portal.call(_thread_name())
    assert folds, "the WAL was never checkpointed"
    assert all(name != loop_thread and left == 0 for name, left in folds), folds


async def _thread_name() -> str:
    return threading.current_thread().name
