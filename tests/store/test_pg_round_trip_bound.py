"""Every PostgreSQL round trip is bounded (promise 14): a store call on a path that hangs, or
that a middlebox turned half-open, fails within the bound with an infrastructure fault, its
connection is discarded, and once the path heals the pool serves a fresh one.

The path is keel.testing.netproxy's proxy in front of the shared server: it is never stopped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from keel.backends.postgres import PostgresConnector, RoundTripTimeout
from keel.core.store.base import Tx
from keel.core.store.store import Store
from keel.testing.netproxy import NetProxy

pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)

BOUND = 1.0
Call = Callable[[Store], Awaitable[Any]]


async def _read(store: Store) -> Any:
    return await store.database_now()


async def _single(store: Store) -> Any:
    return await store.db.single("database_now")


async def _transaction(store: Store) -> Any:
    async with store.transaction() as tx:
        return await tx.one("database_now")


async def _step_transaction(store: Store) -> Any:
    async def body(tx: Tx) -> Any:
        return await tx.one("database_now")

    return await store.step_transaction(body)


CALLS = {
    "read": _read,
    "single": _single,
    "transaction": _transaction,
    "step_transaction": _step_transaction,
}


@pytest.fixture
def proxy(db_url: str) -> Iterator[NetProxy]:
    server = urlsplit(db_url)
    with NetProxy(server.hostname or "127.0.0.1", server.port or 5432) as running:
        yield running


def _store(url: str, bound: float | None = BOUND) -> Store:
    # 0: unbounded (what Keel did before), to show the test would hang without the bound.
    return Store(PostgresConnector(url, lease_ttl=3.0, round_trip_timeout=bound or 0))


async def _timed(call: Awaitable[Any], patience: float) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        await asyncio.wait_for(call, patience)
    except Exception as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("fault", ["hang", "half_open"])
def test_a_store_call_on_a_dead_path_fails_within_the_bound_and_the_pool_recovers(
    db_url: str, proxy: NetProxy, call: str, fault: str
) -> None:
    store = _store(proxy.url_for(db_url))

    async def scenario() -> None:
        await store.db.open()
        try:
            await CALLS[call](store)  # a warm connection in the pool: the fault hits it
            getattr(proxy, fault)()
            failed, took = await _timed(CALLS[call](store), patience=BOUND + 8)
            assert failed is not None, "the call succeeded through a dead path"
            assert not isinstance(failed, TimeoutError), f"not bounded: hung for {took:.1f}s"
            assert isinstance(failed, RoundTripTimeout), repr(failed)
            assert store.is_infrastructure(failed) and store.is_keel_fault(failed)
            assert BOUND - 0.1 <= took <= BOUND + 1.5, took
            assert f"within {BOUND:g} s" in str(failed)
            proxy.heal()
            # The abandoned connection was closed, not returned: the next call gets a working
            # one (the pool's replacement, or a new one) at once.
            started = time.monotonic()
            assert await asyncio.wait_for(CALLS[call](store), 10) is not None
            assert time.monotonic() - started < BOUND
        finally:
            await store.db.close()

    asyncio.run(scenario())


def test_a_reply_slower_than_usual_but_within_the_bound_is_waited_for(
    db_url: str, proxy: NetProxy
) -> None:
    store = _store(proxy.url_for(db_url))

    async def scenario() -> None:
        await store.db.open()
        try:
            await _read(store)
            proxy.hold_replies(BOUND / 3)
            started = time.monotonic()
            await _step_transaction(store)
            assert time.monotonic() - started >= BOUND / 3 - 0.05
        finally:
            await store.db.close()

    asyncio.run(scenario())


def test_waiting_for_a_connection_is_bounded_when_none_can_be_made(
    db_url: str, proxy: NetProxy
) -> None:
    """A half-open path swallows new connections too: the connect timeout ends each attempt
    and the pool's checkout wait ends with an infrastructure fault, not never."""
    store = _store(proxy.url_for(db_url))

    async def scenario() -> None:
        await store.db.open()
        try:
            await _read(store)
            proxy.half_open()
            for _ in range(2):  # the warm connection times out, then no new one can be made
                failed, took = await _timed(_read(store), patience=BOUND + 10)
                assert failed is not None and not isinstance(failed, TimeoutError), took
                assert store.is_infrastructure(failed), repr(failed)
                assert took <= BOUND + 3, took
            proxy.heal()
            # As a worker does: back off and try again until the pool has a connection (its
            # attempts during the outage failed; it makes one anew within a lease TTL).
            healed = time.monotonic()
            while True:
                failed, took = await _timed(_read(store), patience=BOUND + 10)
                if failed is None:
                    break
                assert store.is_infrastructure(failed), repr(failed)
                assert time.monotonic() - healed < 10, "no connection after healing"
                await asyncio.sleep(0.5)
        finally:
            await store.db.close()

    asyncio.run(scenario())


async def _started(call: Awaitable[Any]) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(call)
    await asyncio.sleep(0.1)  # the query is on the wire (its reply held by the proxy)
    assert not task.done()
    return task


def _stall_loop(seconds: float) -> None:
    """What a GC pause, CPU steal or a loaded host does to a worker: nothing on the loop runs."""
    time.sleep(seconds)


def test_a_loop_stalled_past_the_bound_keeps_an_answer_that_arrived(
    db_url: str, proxy: NetProxy
) -> None:
    """The reply came back while the worker's loop was frozen past the bound: the round trip
    succeeded, and its connection is not abandoned for the worker's own stall."""
    store = _store(proxy.url_for(db_url))

    async def scenario() -> None:
        await store.db.open()
        try:
            await _read(store)
            proxy.hold_replies(0)
            await _read(store)  # every connection the pool keeps is open now
            connections = proxy.counters().accepted
            proxy.hold_replies(BOUND / 4)
            task = await _started(_read(store))
            _stall_loop(BOUND * 1.6)  # the reply arrives during the stall
            failed, _ = await _timed(task, patience=BOUND + 8)
            assert failed is None, repr(failed)
            proxy.hold_replies(0)
            for _ in range(3):
                await _read(store)
            assert proxy.counters().accepted == connections, "a connection was abandoned"
        finally:
            await store.db.close()

    asyncio.run(scenario())


def test_a_loop_stalled_before_its_answer_came_gives_the_path_its_time_back(
    db_url: str, proxy: NetProxy
) -> None:
    """A stall while the reply is still on its way: the path gets back the time the loop was
    away; a reply within that time is kept, and a dead path is still abandoned, within twice
    the bound of the stall's end."""
    store = _store(proxy.url_for(db_url))

    async def scenario() -> None:
        await store.db.open()
        try:
            await _read(store)
            proxy.hold_replies(BOUND * 1.7)  # arrives after the stall ends, within its time
            task = await _started(_read(store))
            _stall_loop(BOUND * 1.4)
            failed, _ = await _timed(task, patience=BOUND + 8)
            assert failed is None, repr(failed)

            proxy.hang()
            task = await _started(_read(store))
            _stall_loop(BOUND * 1.4)
            resumed = time.monotonic()
            failed, took = await _timed(task, patience=BOUND * 2 + 8)
            assert isinstance(failed, RoundTripTimeout), repr(failed)
            assert took <= BOUND * 2, took
            assert time.monotonic() - resumed >= BOUND * 0.3
        finally:
            await store.db.close()

    asyncio.run(scenario())
