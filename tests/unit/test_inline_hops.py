"""Upstream's saver hands a checkpoint's blob values to a thread to serialize them. For a small
state Keel's loop runs that work where it is asked for instead (`LoopThreads`, `hop_inline`),
and only a state the size walk can prove small counts as one (`small_state`)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from keel.backends.pg_batch import LARGE
from keel.core.portal import Portal, hop_inline
from keel.langgraph.recording import WALK, recorded, small_state


def _thread_of_a_hop(inline: bool) -> tuple[str, str]:
    """(the loop's thread, the thread `asyncio.to_thread` ran on), on a portal's loop."""
    portal = Portal(name="keel-test-loop")
    try:

        async def hop() -> tuple[str, str]:
            with recorded([], inline=inline):
                ran_on = await asyncio.to_thread(lambda: threading.current_thread().name)
            return threading.current_thread().name, ran_on

        return portal.call(hop())
    finally:
        portal.close()


def test_a_hop_asked_inline_runs_on_the_loop_and_any_other_on_a_pool_thread() -> None:
    loop_thread, ran_on = _thread_of_a_hop(inline=True)
    assert ran_on == loop_thread
    loop_thread, ran_on = _thread_of_a_hop(inline=False)
    assert ran_on != loop_thread and ran_on.startswith("keel-node")


def test_an_inline_hop_raises_in_its_caller_and_the_flag_ends_with_the_block() -> None:
    portal = Portal(name="keel-test-loop")

    def fails() -> None:
        raise ValueError("cannot serialize")

    async def hop() -> bool:
        with recorded([], inline=True), pytest.raises(ValueError, match="cannot serialize"):
            await asyncio.to_thread(fails)
        return hop_inline.get()

    try:
        assert portal.call(hop()) is False
    finally:
        portal.close()


@dataclass
class Note:
    text: str
    tags: list[str] = field(default_factory=list)


class Opaque:
    __slots__ = ("payload",)  # nothing a walk can look into

    def __init__(self) -> None:
        self.payload = b"?" * 10


@pytest.mark.parametrize(
    ("values", "small"),
    [
        ([0, None, [], "x" * 100, True, 1.5], True),
        ([[HumanMessage("hello " * 20), AIMessage("x" * 2000)] * 5], True),
        ([{"notes": [Note("a", ["b"])]}], True),
        (["x" * (LARGE + 1)], False),
        ([["y" * (LARGE // 2), b"z" * (LARGE // 2 + 1)]], False),
        ([[Note("x" * (LARGE + 1))]], False),
        ([list(range(WALK + 1))], False),
        ([Opaque()], False),
    ],
    ids=[
        "scalars",
        "messages",
        "dataclasses",
        "a-large-string",
        "large-together",
        "large-inside-an-object",
        "too-many-values-to-walk",
        "opaque",
    ],
)
def test_only_a_state_the_walk_proves_small_is_serialized_inline(
    values: list[Any], small: bool
) -> None:
    assert small_state(values) is small
