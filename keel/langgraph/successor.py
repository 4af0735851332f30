"""A run's end that claims the worker's next run in the same transaction.

The executor ends a run with `then_claim` when its worker offers a `Successor`: one commit ends
this run and leases the next, so a worker with a backlog does not pay a claim's round trip
between runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from keel.core.store.base import EndWith, Later, Row, Tx


class Successor(Protocol):
    """A worker's offer to claim the next run in the last transaction of a run it executes
    (keel.runtime.handoff.Handoff: the same protocol as a claim committed with an admission)."""

    def reserve(self) -> Callable[[Tx], Awaitable[Later]] | None:
        """Hold the slot the ending run gives up; the claim to commit with its end, or None."""

    def release(self) -> None:
        """Give the slot back: the end's transaction did not commit."""

    async def adopt(self, claimed: Row | None) -> None:
        """The end committed, with the claim's row or None: execute it."""


def then_claim(within: EndWith, successor: Successor) -> EndWith:
    """`within` (the run's last transaction, its end at the close), with the successor's claim
    after the end: one commit (on PostgreSQL one message) ends this run and leases the next.
    The claim is fenced with the end: a stale token rolls both back. Its row is read once the
    transaction committed, even if the saver then stops this run (a cancel asked meanwhile),
    and handed to the worker; a kill between the commit and the hand-off leaves a lease nobody
    renews, taken over once it lapses, as after any claim."""

    async def end_then_claim(end: Callable[[Tx], Awaitable[Later]]) -> Row | None:
        claim = successor.reserve()
        if claim is None:
            return await within(end)
        claimed: list[Row | None] = []

        async def both(tx: Tx) -> Later:
            ended = await end(tx)
            got = await claim(tx)

            async def rows() -> Row | None:
                claimed.append(await got())  # committed: read before anything may raise
                return await ended()

            return rows

        try:
            return await within(both)
        finally:
            if claimed:
                await successor.adopt(claimed[-1])
            else:
                successor.release()

    return end_then_claim
