"""A worker makes room in PostgreSQL's pool for the runs it executes at once: at a concurrency
above the pool's default size, every run can hold a transaction at the same time instead of
queueing for a connection (and failing with PoolTimeout when the queue outlasts the bound)."""

from __future__ import annotations

import asyncio

import pytest

from keel.backends.postgres import LOOPS_BESIDE_RUNS, PostgresConnector, RoundTripTimeout
from keel.core.store.store import Store

pytestmark = pytest.mark.postgres

RUNS = 16
"""Above the pool's default maximum (10)."""


@pytest.fixture
def backend() -> str:
    return "postgres"


async def _all_hold_a_transaction_together(store: Store, runs: int) -> int:
    """`runs` transactions, each kept open until all of them are (or one failed to get a
    connection): how many were open at once; the first failure is raised."""
    inside = 0
    everyone = asyncio.Event()

    async def one() -> None:
        nonlocal inside
        try:
            async with store.transaction() as tx:
                await store.db_now(tx)
                inside += 1
                if inside == runs:
                    everyone.set()
                await everyone.wait()
        finally:
            everyone.set()  # a failed checkout releases the others

    outcomes = await asyncio.gather(*(one() for _ in range(runs)), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return inside


def test_room_for_every_run_lets_them_all_hold_a_connection_at_once(db_url: str) -> None:
    async def go() -> tuple[int, int]:
        connector = PostgresConnector(db_url, lease_ttl=6.0)
        store = Store(connector)
        await connector.open()
        try:
            await connector.make_room(RUNS)
            together = await asyncio.wait_for(_all_hold_a_transaction_together(store, RUNS), 20)
            # A worker stopping gives its room back: the next one's runs fit the same pool.
            await connector.make_room(-RUNS)
            await connector.make_room(RUNS)
            return together, connector.pool.max_size
        finally:
            await connector.close()

    together, size = asyncio.run(go())
    assert together == RUNS
    assert size == RUNS + LOOPS_BESIDE_RUNS


def test_without_room_the_default_pool_cannot_hold_them_all(db_url: str) -> None:
    """The control: the same transactions on a pool nobody made room in queue for the default
    ten connections, and the round-trip bound ends the wait."""

    async def go() -> BaseException | None:
        connector = PostgresConnector(db_url, lease_ttl=6.0)
        store = Store(connector)
        await connector.open()
        try:
            await asyncio.wait_for(_all_hold_a_transaction_together(store, RUNS), 20)
        except Exception as exc:  # the pool's bounded checkout, as a transient database fault
            return exc
        finally:
            await connector.close()
        return None

    failure = asyncio.run(go())
    assert failure is not None, "16 open transactions fit a pool of 10 without room made"
    # The ten that got a connection wait for the rest past the round-trip bound, and are
    # abandoned as round trips that got no answer.
    assert isinstance(failure, RoundTripTimeout), repr(failure)
