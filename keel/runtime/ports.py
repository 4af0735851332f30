"""What a worker needs of the runtime it serves: its port, narrower than the Runtime.

The worker reads the core's services (store, clock, lease TTL, notifiers) and its workflows,
listens on the connector, executes with the runtime's fenced executor, and takes part in the
runtime's wake-ups and hand-off; every command it runs is the core's, called on `services`.
`keel.runtime.runtime.Runtime` is one; a test may hand a worker any other.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from keel.core.services import Services
from keel.core.store.base import Connector
from keel.core.workflows import Workflows
from keel.langgraph.executor import Executor
from keel.runtime.handoff import Taker


class WorkerHost(Protocol):
    @property
    def services(self) -> Services: ...

    @property
    def workflows(self) -> Workflows: ...

    @property
    def connector(self) -> Connector: ...

    @property
    def heartbeat_interval(self) -> float: ...

    async def open(self) -> None:
        """Connect and check the schema (idempotent)."""

    def check_workflows(self) -> None:
        """InvalidWorkflow unless every workflow's graph compiles."""

    async def hold_shapes(self, worker_id: str) -> dict[str, str]:
        """Workflow key -> what differs, for each version whose graph here is not the one it
        was first served with (the worker refuses those)."""

    def executor(self, worker_id: str) -> Executor:
        """The executor of runs, on the open runtime's fenced saver."""

    def set_draining(self, draining: bool) -> None:
        """Runs give their lease back at their next step boundary while draining."""

    def waker(self) -> asyncio.Event:
        """An event set whenever this process admits or queues a run."""

    def add_taker(self, taker: Taker) -> None:
        """Offer the worker's free slots to this process's next admissions and decisions."""

    def remove_taker(self, taker: Taker) -> None: ...
