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
    rt = app.aio
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
            await rt.submit("echo", job_id="busy", input={"text": "x"})
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
