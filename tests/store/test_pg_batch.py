"""A PostgreSQL transaction as one message (keel.backends.pg_batch): repeated statements are
prepared once per connection, and one the server will not prepare runs bound inline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from psycopg.types.json import Json, Jsonb

import keel
from keel.backends.pg_batch import Batch, _numbered
from tests.support.graphs import echo_graph

AppFactory = Callable[..., keel.App]
pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def test_placeholders_become_numbers_once_per_name(backend: str) -> None:
    assert _numbered("SELECT %(a)s, %(b)s, %(a)s, 10 %% 3") == (
        "SELECT $1, $2, $1, 10 % 3",
        ("a", "b"),
    )
    assert _numbered("INSERT INTO t VALUES (%s, %s)") == ("INSERT INTO t VALUES ($1, $2)", (0, 1))
    assert _numbered("SELECT 1") == ("SELECT 1", ())


def _events(app: keel.App, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in app.get_run(run_id).timeline if e["kind"] == kind]


def test_a_statement_the_server_will_not_prepare_runs_bound_inline(
    make_app: AppFactory,
) -> None:
    app = make_app()
    app.workflow("echo")(echo_graph)
    run = app.submit("echo", job_id="inline", input={"text": "x"})["run_id"]
    store = app.aio.runtime.store

    async def body(tx: Any) -> None:
        # `SELECT $1` alone: the server cannot tell the parameter's type (42P18).
        await tx.replay(("SELECT %s AS untyped", ("x",), False))
        await store.add_event(tx, run, "probe", {"n": 1})

    for _ in range(3):  # refused once, then inline from the start
        app.aio.runtime.portal.call(store.step_transaction(body))
    assert _events(app, run, "probe") == [{"n": 1}] * 3


def _submitted(make_app: AppFactory, job_id: str) -> tuple[keel.App, str]:
    """A run admitted by another App: this App's connections have prepared nothing yet."""
    submitter = make_app()
    submitter.workflow("echo")(echo_graph)
    run = submitter.submit("echo", job_id=job_id, input={"text": "x"})["run_id"]
    app = make_app()
    app.workflow("echo")(echo_graph)
    assert app.get_run(run).status == "queued"  # opened, by a read (reads prepare nothing)
    return app, run


def test_a_statement_is_prepared_once_per_connection(make_app: AppFactory) -> None:
    app, run = _submitted(make_app, "prepared")
    store = app.aio.runtime.store
    seen: list[tuple[int, int]] = []

    async def body(tx: Any) -> None:
        for n in range(3):
            await store.add_event(tx, run, "probe", {"n": n})
        cur = await tx.connection.execute(  # this connection's, before the message is sent
            "SELECT count(*) AS n FROM pg_prepared_statements WHERE name LIKE 'keel\\_%'"
        )
        row = await cur.fetchone()
        seen.append((tx.prepares, int(row["n"])))

    for _ in range(2):
        app.aio.runtime.portal.call(store.step_transaction(body))
    first, second = seen
    assert first == (1, 0)  # the three events: one PREPARE, three EXECUTEs
    assert second in ((0, 1), (1, 0))  # the same connection again, or another one
    assert _events(app, run, "probe") == [{"n": 0}, {"n": 1}, {"n": 2}] * 2


def test_prepared_statements_dropped_by_psycopg_are_prepared_again(make_app: AppFactory) -> None:
    """psycopg deallocates every prepared statement of a connection (DEALLOCATE ALL) when a
    transaction on it rolls back after psycopg prepared statements of its own (a query run five
    times): a step transaction then EXECUTEs names the server forgot. It must prepare them
    again, not fail the run (it did: 'prepared statement "keel_6" does not exist')."""
    app, run = _submitted(make_app, "deallocated")
    store = app.aio.runtime.store
    seen: list[tuple[int, int, int]] = []

    async def body(tx: Any) -> None:
        await store.add_event(tx, run, "probe", {"n": len(seen)})
        cur = await tx.connection.execute(
            "SELECT count(*) AS n FROM pg_prepared_statements WHERE name LIKE 'keel\\_%'"
        )
        row = await cur.fetchone()
        seen.append((id(tx.connection), tx.prepares, int(row["n"])))

    async def psycopg_prepares_then_rolls_back() -> int:
        for _ in range(20):  # the pool hands its connections out in turn
            async with store.db.pool.connection() as conn:
                if id(conn) == seen[0][0]:
                    return await on_it(conn)
        raise AssertionError("the step's connection never came back from the pool")

    async def on_it(conn: Any) -> int:
        for _ in range(6):  # psycopg prepares a query it has run five times
            await conn.execute("SELECT %s::int AS n", (1,))
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("SELECT 1")
                raise RuntimeError("rolled back")
        cur = await conn.execute(
            "SELECT count(*) AS n FROM pg_prepared_statements WHERE name LIKE 'keel\\_%'"
        )
        row = await cur.fetchone()
        await conn.commit()
        return int(row["n"])

    portal = app.aio.runtime.portal
    portal.call(store.step_transaction(body))  # prepares the event insert
    assert seen[0][1:] == (1, 0)
    assert portal.call(psycopg_prepares_then_rolls_back()) == 0  # psycopg's DEALLOCATE ALL
    first = seen[0][0]
    calls = 1
    while seen[-1][0] != first or calls == 1:  # the pool hands its connections out in turn
        assert calls < 20, seen
        portal.call(store.step_transaction(body))
        calls += 1
    # That connection's first try EXECUTEd a name the server had forgotten; it was sent again,
    # preparing afresh, and committed once.
    assert seen[-2:] == [(first, 0, 0), (first, 1, 0)], seen
    probes = [e["n"] for e in _events(app, run, "probe")]
    assert len(probes) == calls and probes[-1] == len(seen) - 1, (probes, seen)


def _longest_string(value: Any) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, Json | Jsonb):
        return _longest_string(value.obj)
    if isinstance(value, dict):
        return max(map(_longest_string, value.values()), default=0)
    if isinstance(value, list | tuple):
        return max(map(_longest_string, value), default=0)
    return 0


def test_a_large_state_is_bound_off_the_event_loop(
    make_app: AppFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large string channel (half a megabyte here) rides inline in the checkpoint's JSONB:
    dumping and escaping it on the loop stalled every other run there for tens of ms."""
    app = make_app()
    app.workflow("echo")(echo_graph)
    big = 500_000
    bound: list[tuple[int, bool]] = []
    add = Batch.add

    def watched(self: Batch, sql: Any, params: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        bound.append((_longest_string(params), on_loop))
        return add(self, sql, params)

    # (The admission binds its input as psycopg does any statement's: only the steps here.)
    run = app.submit("echo", job_id="large", input={"text": "x" * big})["run_id"]
    monkeypatch.setattr(Batch, "add", watched)
    app.run_worker(stop_when_idle=True, handle_signals=False)
    assert app.get_run(run).status == "completed"
    large = [on_loop for longest, on_loop in bound if longest >= big]
    assert large, bound  # the checkpoints carrying the string went through Batch.add
    assert not any(large), bound
