"""Effect timeouts on the real clock: a provider call that outlives its declared timeout.

The caller stops waiting at the timeout. An async call is cancelled; a sync call runs on in a
thread of its own, and its execution waits for it until the key's deadline: a late answer is
recorded, a call still running at the deadline leaves the key in doubt. Neither is resent on a
guess. These tests let real time pass (a second or so each), so they live outside the unit tier.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import keel
from keel.core.effects.ledger import Effect
from tests.support.by_hand import Node, Paused, memory_app, start
from tests.support.providers import Provider


def ledger(node: Node) -> list[tuple[str, int]]:
    return [(e["status"], e["attempts"]) for e in node.app.get_run(node.run_id).effects]


def timeline(node: Node, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in node.app.get_run(node.run_id).timeline if e["kind"] == kind]


@pytest.fixture
def real_app() -> Iterator[keel.App]:
    """An app on the real clock: abandoned calls run on in real threads, so the database's
    time must pass with them."""
    made = memory_app(keel.SystemClock())
    try:
        yield made
    finally:
        made.close()


class SlowProvider(Provider):
    """Commits a request `delay` seconds after it arrived, whether or not its client waits."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def slow_deliver(self, key: str, to: str) -> Any:
        time.sleep(self.delay)
        return self.deliver(key, to)


def test_a_sync_call_past_its_timeout_that_answers_late_is_recorded_not_resent(
    real_app: keel.App,
) -> None:
    """The caller stops waiting at the timeout, but its thread still waits on the provider:
    nothing is asked or sent while it can still land, and its late answer settles the key."""
    provider = SlowProvider(delay=0.6)
    asked: list[str] = []

    def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        return provider.slow_deliver(idempotency_key, to)

    def lookup(to: str, *, idempotency_key: str) -> Any:
        asked.append(idempotency_key)
        return provider.lookup(idempotency_key)

    effect = keel.effect("send", reconcile=lookup, timeout=0.2)(send)
    node = start(real_app)
    result = node.call(effect, "a@example.com")
    assert result == provider.lookup(provider.calls[0])
    assert len(provider.calls) == 1 and len(provider.deliveries) == 1
    assert asked == [], "the reconciler was asked while the call was under way"
    assert ledger(node) == [("sent", 1)]
    assert [e["timeout"] for e in timeline(node, "effect.timed_out")] == [0.2]
    assert len(timeline(node, "effect.awaiting_call")) == 1


def test_a_sync_call_still_under_way_past_its_deadline_is_left_to_a_person(
    real_app: keel.App,
) -> None:
    """A reconcile-only provider that commits late: the key goes in doubt while the thread
    still waits, never reconciled ("not found") and called again."""
    provider = SlowProvider(delay=3.0)

    def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        return provider.slow_deliver(idempotency_key, to)

    def lookup(to: str, *, idempotency_key: str) -> Any:
        return provider.lookup(idempotency_key)

    effect = keel.effect("send", reconcile=lookup, timeout=0.2)(send)
    node = start(real_app)
    with pytest.raises(Paused):
        node.call(effect, "a@example.com")
    assert len(provider.calls) == 1
    assert ledger(node) == [("in_doubt", 0)]


def test_an_async_call_past_its_timeout_is_cancelled_and_never_resent_on_a_guess(
    real_app: keel.App,
) -> None:
    """No reconciler and a provider that does not dedupe: an abandoned call's key is in doubt
    for a person, not sent again."""
    provider = Provider()
    cancelled = threading.Event()

    async def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return provider.deliver(idempotency_key, to)

    effect: Effect[..., Any] = keel.effect("send", timeout=0.2)(send)
    node = start(real_app)

    async def in_async_node() -> Any:
        return await effect("a@example.com")

    def body() -> Any:
        return real_app.aio.runtime.portal.call(in_async_node())

    with pytest.raises(Paused):
        node.execute(body)
    assert cancelled.is_set()
    assert len(provider.calls) == 1 and provider.deliveries == []
    assert ledger(node) == [("in_doubt", 0)]


def test_a_retry_policy_of_one_attempt_still_asks_the_reconciler_after_a_timeout(
    real_app: keel.App,
) -> None:
    provider = Provider()
    asked: list[str] = []

    async def send(to: str, *, idempotency_key: str) -> Any:
        provider.calls.append(idempotency_key)
        provider.deliver(idempotency_key, to)  # committed, then the answer never comes
        await asyncio.sleep(5)

    async def lookup(to: str, *, idempotency_key: str) -> Any:
        asked.append(idempotency_key)
        return provider.lookup(idempotency_key)

    effect: Effect[..., Any] = keel.effect(
        "send", reconcile=lookup, timeout=0.2, retry=keel.Retry(max_attempts=1)
    )(send)
    node = start(real_app)

    async def in_async_node() -> Any:
        return await effect("a@example.com")

    result = node.execute(lambda: real_app.aio.runtime.portal.call(in_async_node()))
    assert result == provider.lookup(provider.calls[0]) and len(asked) == 1
    assert len(provider.deliveries) == 1 and ledger(node) == [("confirmed", 1)]
