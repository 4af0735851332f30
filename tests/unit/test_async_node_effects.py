"""A sync effect called from an async node, by hand: refused before anything is reserved, with
an error that names the effect, the node and the ways out; and the way out that keeps the node
async (`await asyncio.to_thread(effect, ...)`) performs the effect once, as a sync node would.

The async node is a coroutine on the app's loop (where Keel runs async nodes) inside the run's
context (tests/support/by_hand.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

import keel
from keel.core import context
from keel.core.errors import UsageError
from tests.support.by_hand import Node, on_loop, start

T = TypeVar("T")


def in_async_node(node: Node, body: Callable[[], Awaitable[T]]) -> T:
    """Run `body` as an async node of the run does: on Keel's loop, inside the run."""

    node._attempt = object()  # a new execution: its calls numbered from 0, as in Node.execute

    async def execute() -> T:
        entered = context.enter(node.ctx)
        try:
            return await body()
        finally:
            context.leave(entered)

    return on_loop(node.app, execute())


def send_effect(calls: list[str]) -> Any:
    @keel.effect("send_email")
    def send(to: str, *, idempotency_key: str) -> str:
        calls.append(to)
        return f"sent to {to}"

    return send


def test_a_sync_effect_in_an_async_node_is_refused_naming_the_effect_node_and_fixes(
    app: keel.App,
) -> None:
    calls: list[str] = []
    send = send_effect(calls)
    node = start(app, name="draft_and_send")

    async def body() -> Any:
        return send("a@example.com")  # blocking: the loop would wait on itself

    with pytest.raises(UsageError) as refused:
        in_async_node(node, body)
    message = str(refused.value)
    assert "effect 'send_email'" in message and "node 'draft_and_send'" in message, message
    # The three ways out, each as the user would write it.
    assert "`await asyncio.to_thread(send, ...)`" in message, message
    assert "`async def`" in message and "plain `def`" in message, message
    assert calls == [] and app.get_run(node.run_id).effects == []  # nothing reserved


def test_await_asyncio_to_thread_calls_a_sync_effect_from_an_async_node_once(
    app: keel.App,
) -> None:
    calls: list[str] = []
    send = send_effect(calls)
    node = start(app, name="draft_and_send")

    async def body() -> Any:
        return await asyncio.to_thread(send, "a@example.com")

    assert in_async_node(node, body) == "sent to a@example.com"
    assert in_async_node(node, body) == "sent to a@example.com"  # a replay: from the ledger
    assert calls == ["a@example.com"]
    assert [e["status"] for e in app.get_run(node.run_id).effects] == ["sent"]
