"""The sync facade's loop ends cleanly: what still runs on it when it closes is cancelled and
let finish, never destroyed pending (an asyncio ERROR at every deploy that cut a call off)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pytest

from keel.core.portal import Portal


def test_closing_with_a_call_still_pending_cancels_it_without_an_asyncio_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    portal = Portal(name="keel-test-loop")
    started, outcome = threading.Event(), []

    async def held() -> None:
        started.set()
        await asyncio.sleep(3600)  # a provider call a shutdown cut off

    def node_thread() -> None:  # a sync node blocked in the facade, as after a cancelled run
        try:
            portal.call(held())
        except BaseException as exc:
            outcome.append(type(exc).__name__)

    thread = threading.Thread(target=node_thread, daemon=True)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        thread.start()
        assert started.wait(5)
        portal.close()
        thread.join(5)
        gc.collect()  # where a destroyed pending task would be reported
    assert outcome == ["CancelledError"], "the blocked caller was told, not left hanging"
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
