"""A run admitted (or decided) in this process, taken by this process's worker in the same commit.

The same hand-off serves a worker draining a backlog: a run's last transaction (its last step's
checkpoint and its end) also claims the next run into the slot it gives up (`Worker._successor`,
`Executor.successor`), so a queued run costs no claim transaction of its own.

A worker that has a free slot offers it to the runtime (`Runtime.add_taker`); the next `submit`
or decision commits its own write and the worker's claim in one transaction (on PostgreSQL one
message), then hands the claimed run to the worker. The claim is the worker's own statement
(the oldest claimable run, which need not be the one just admitted), so what it may take and
the lease it gets are those of any claim; only the commit, and the wait for the worker to wake
and claim, are saved.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from keel.core import leases
from keel.core.faults import fault_point
from keel.core.services import Services
from keel.core.store.base import Later, Row, Tx
from keel.core.store.store import Lease
from keel.core.workflows import Workflows

Claim = Callable[[Tx], Awaitable[Later]]


class Taker(Protocol):
    """A worker in this process that can take a run in the transaction that admits it."""

    def reserve(self) -> Claim | None:
        """Hold a free slot; return the claim to commit with the admission, or None."""

    def release(self) -> None:
        """Give the slot back: the admission failed."""

    async def adopt(self, claimed: Row | None) -> None:
        """The admission committed, with the claim's row or None (nothing was claimable):
        execute it; the slot is given back."""


class Reserved:
    """A taker's slot held for one write: given back unless the write's claim was adopted."""

    def __init__(self, taker: Taker) -> None:
        self.taker = taker
        self.adopted = False

    async def adopt(self, claimed: Row | None) -> None:
        self.adopted = True
        await self.taker.adopt(claimed)

    def give_back(self) -> None:
        if not self.adopted:
            self.taker.release()


class Handoff:
    """A worker's side of `Taker`: `free` says whether it can take one more run, `start`
    executes a claimed one."""

    def __init__(
        self,
        services: Services,
        workflows: Workflows,
        worker_id: str,
        *,
        free: Callable[[int], bool],
        start: Callable[[Lease, Row], None],
        empty: Callable[[], None] | None = None,
    ) -> None:
        self.store = services.store
        self.workflows = workflows
        self.worker_id = worker_id
        self.ttl = services.lease_ttl
        self.max_crashes = services.attempts.max_crashes
        self._wake = services.wake
        self.reserved = 0
        """Slots held for claims committing with an admission (the claim loop leaves them)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The worker's event loop while it offers its slots (None once it stops)."""
        self._free = free
        self._start = start
        self._empty = empty
        """Told when a committed claim found nothing to claim."""
        self._since = 0.0

    def open(self, loop: asyncio.AbstractEventLoop) -> Handoff:
        """The worker runs on `loop`: offer its slots to submits there."""
        self.loop = loop
        return self

    def close(self) -> Handoff:
        """The worker is stopping: a claim committing now gives its run back."""
        self.loop = None
        return self

    def reserve(self) -> Claim | None:
        # Only a submit on the worker's own event loop: the claimed run is started there.
        if self.loop is not asyncio.get_running_loop() or not self._free(self.reserved):
            return None
        self.reserved += 1
        self._since = time.monotonic()
        keys, limits = self.workflows.keys(), self.workflows.limits()
        return leases.claim_with(self.store, self.worker_id, keys, self.ttl, limits)

    def release(self) -> None:
        self.reserved -= 1

    async def adopt(self, claimed: Row | None) -> None:
        try:
            if claimed is None:
                if self._empty is not None:
                    self._empty()
                return
            # The run is leased to this process and nothing has started it: a kill here leaves
            # a lease nobody renews, which the next claim takes over once it lapses.
            fault_point("handoff.after_commit", str(claimed["workflow"]))
            self.store.log_claim(claimed, self.worker_id, self._since)
            got = await leases.accept(self.store, self.worker_id, claimed, self.max_crashes)
        finally:
            self.reserved -= 1
        if got is None:
            self._wake()  # failed past its crash limit: the claim loop looks again
        elif self.loop is None:  # the worker stopped meanwhile: the run goes back at once
            await leases.release(self.store, got[0], "worker stopping")
        else:
            self._start(*got)
