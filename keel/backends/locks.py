"""An asyncio lock the owning task may take again (SQLite shares one connection)."""

from __future__ import annotations

import asyncio
from types import TracebackType


class TaskReentrantLock:
    """Like asyncio.Lock, but re-entrant for the task that holds it.

    Keel's SQLite store and the LangGraph saver share one connection; a fenced checkpoint write
    opens the transaction (taking this lock) and then calls the saver, which takes it again.
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[object] | None = None
        self._depth = 0

    async def acquire(self) -> bool:
        task = asyncio.current_task()
        if self._owner is task and task is not None:
            self._depth += 1
            return True
        await self._lock.acquire()
        self._owner, self._depth = task, 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def owned(self) -> bool:
        """Held by the task asking."""
        task = asyncio.current_task()
        return task is not None and self._owner is task

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
