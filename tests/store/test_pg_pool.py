"""PostgreSQL's pool hands a run's transactions the connection returned last: one warm server
process serves consecutive steps while the others stay idle (and are the ones the pool closes
when it shrinks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import keel

AppFactory = Callable[..., keel.App]
pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


def test_consecutive_transactions_take_the_connection_returned_last(
    make_app: AppFactory,
) -> None:
    app = make_app()
    rt = app.aio.runtime
    store = rt.store

    async def scenario() -> tuple[list[int], int, list[int]]:
        await rt.open()
        pool = rt.connector.pool  # type: ignore[attr-defined]
        # Three at once: the pool grows to three connections. Returned c, then b, then a.
        async with pool.connection() as a, pool.connection() as b, pool.connection() as c:
            opened = [conn.info.backend_pid for conn in (a, b, c)]
        last = opened[0]
        served: list[int] = []

        async def body(tx: Any) -> None:
            served.append(tx.connection.info.backend_pid)

        for _ in range(6):
            await store.step_transaction(body)
        return opened, last, served

    opened, last, served = rt.portal.call(scenario())
    assert len(set(opened)) == 3, opened
    # First in, first out would have gone round all three (each step to a cold process).
    assert served == [last] * 6, (opened, served)
