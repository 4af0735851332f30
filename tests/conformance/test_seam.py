"""The private parts of the upstream savers Keel relies on, checked directly (docs/savers.md).

The conformance suite proves the savers still store and load checkpoints through Keel's
subclasses; it cannot see *where* the upstream SQL runs. These tests can: an upgrade that moves
it out of the shared lock (SQLite) or out of `_cursor` (PostgreSQL) would still pass the suite
while checkpoint writes escaped the fenced transaction.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from tests.conformance.conftest import Conformance

SQLITE = [pytest.param("sqlite", id="sqlite")]
POSTGRES = [pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]
META: dict[str, Any] = {"source": "loop", "step": 0, "parents": {}}


def fresh_config() -> RunnableConfig:
    return {"configurable": {"thread_id": str(uuid.uuid4()), "checkpoint_ns": ""}}


@pytest.mark.parametrize("backend", SQLITE)
def test_sqlite_saver_uses_the_connectors_lock_for_the_shared_connection(
    backend: str, conformance: Conformance
) -> None:
    """Keel replaces `AsyncSqliteSaver.lock`; upstream must take `self.lock` for every read
    (its writes only record their statements, which Keel runs in its own transaction)."""
    saver, connector = conformance.saver, conformance.app.aio.runtime.connector
    assert saver.lock.inner is connector.lock  # type: ignore[union-attr]

    async def scenario() -> None:
        config = fresh_config()
        await saver.aput(config, empty_checkpoint(), META, {})
        checkpoints = saver.alist(config)
        async with connector.lock:  # type: ignore[attr-defined]
            read = asyncio.create_task(saver.aget_tuple(config))
            listed = asyncio.create_task(anext(aiter(checkpoints)))
            await asyncio.sleep(0.2)
            assert not read.done() and not listed.done(), "the saver ran without the lock"
        assert (await read) is not None and (await listed) is not None
        await checkpoints.aclose()  # a listing holds the lock until it is closed

    conformance.call(scenario())


@pytest.mark.parametrize("backend", SQLITE + POSTGRES)
def test_checkpoint_writes_roll_back_with_the_fenced_transaction(
    backend: str, conformance: Conformance
) -> None:
    """Upstream's aput/aput_writes statements run in Keel's step transaction, nowhere else: a
    transaction that fails after them leaves neither checkpoint nor writes behind."""
    saver = conformance.saver
    config = fresh_config()
    run_id = config["configurable"]["thread_id"]
    stored = conformance.call(saver.aput(config, empty_checkpoint(), META, {}))

    step_transaction = saver.store.step_transaction

    async def fails_before_commit(body: Callable[[Any], Awaitable[Any]]) -> Any:
        async def then_fail(tx: Any) -> Any:
            await body(tx)
            raise RuntimeError("after the upstream write, before the commit")

        return await step_transaction(then_fail)

    saver.store.step_transaction = fails_before_commit  # type: ignore[method-assign]
    try:
        later = {**stored["configurable"]}
        with pytest.raises(RuntimeError, match="before the commit"):
            conformance.call(saver.aput({"configurable": later}, empty_checkpoint(), META, {}))
        with pytest.raises(RuntimeError, match="before the commit"):
            conformance.call(saver.aput_writes(stored, [("ch", "lost")], "task-1", "a"))
    finally:
        del saver.store.step_transaction

    checkpoints = conformance.call(_collect(saver.alist(config)))
    assert [c.config["configurable"]["checkpoint_id"] for c in checkpoints] == [
        stored["configurable"]["checkpoint_id"]
    ], "a checkpoint committed outside Keel's transaction"
    assert checkpoints[0].pending_writes == [], "writes committed outside Keel's transaction"
    assert _steps(conformance, run_id) == 0

    # And a write outside an execution commits at once, in one transaction: one `step` event.
    conformance.call(saver.aput_writes(stored, [("ch", "kept")], "task-1", "a"))
    assert [w[2] for w in conformance.call(saver.aget_tuple(stored)).pending_writes] == ["kept"]
    assert _steps(conformance, run_id) == 1


async def _collect(items: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in items]


def _steps(conformance: Conformance, run_id: str) -> int:
    events = conformance.call(conformance.app.aio.runtime.store.events(run_id))
    return sum(1 for e in events if e["kind"] == "step")
