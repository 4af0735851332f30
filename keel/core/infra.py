"""Infrastructure faults: the one rule that tells "the database went away" from "the graph failed".

A run that meets a lost connection, a restarting server, a pool timeout, a serialization
failure, a busy or full SQLite file or an I/O error is not failed: its work is given back and
resumed from its last checkpoint. Only the backends know their drivers' error classes, so each
connector answers `is_transient(exc)` for one exception; this module walks the whole chain,
because LangGraph's savers and tasks often re-raise or wrap what the driver raised.

Inside a node the class of an error is not enough: a node that talks to its own database (a
locked SQLite file, a CRM's PostgreSQL that refused the connection) raises the same driver
errors as Keel's store. Those are the graph's failures, for its retry policy and then the run's
status; only a fault of a call Keel itself made (the store, the savers on Keel's connection,
artifact files) gives the run back. `raised_by_keel` tells them apart by the frame that made
the failing call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from keel.core.errors import SlowDatabase

Predicate = Callable[[BaseException], bool]
T = TypeVar("T")
log = logging.getLogger("keel.core.infra")

# Whoever hits them, a full disk or a failing device is the machine's fault, not the graph's.
_OS_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})
_MAX_CHAIN = 64


def causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then everything it was raised from or while handling, and group members."""
    seen: set[int] = set()
    stack = [exc]
    while stack and len(seen) < _MAX_CHAIN:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
        for linked in (current.__context__, current.__cause__):
            if linked is not None:
                stack.append(linked)


def is_infrastructure(exc: BaseException, backend: Predicate) -> bool:
    """True if `exc`, or anything in its chain, is an infrastructure fault (see module doc)."""
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.errno in _OS_ERRNOS:
            return True
        if isinstance(cause, SlowDatabase) or backend(cause):
            return True
    return False


def is_keel_fault(exc: BaseException, backend: Predicate) -> bool:
    """True if something in `exc`'s chain is an infrastructure fault of a call Keel made."""
    return any(
        isinstance(c, SlowDatabase)  # only Keel's own look at its lease raises it
        or (
            ((isinstance(c, OSError) and c.errno in _OS_ERRNOS) or backend(c)) and raised_by_keel(c)
        )
        for c in causes(exc)
    )


# Frames of these packages sit between a caller and the failure: the caller is who asked.
_DRIVERS = frozenset({"psycopg", "psycopg_pool", "psycopg_c", "psycopg_binary", "aiosqlite"})
_KEEL_CODE = ("keel.", "langgraph.checkpoint.")
_USER_CODE_IN_KEEL = ("keel.demo.",)  # the bundled example graphs are a user's nodes


def raised_by_keel(exc: BaseException) -> bool:
    """Whether the innermost frame that called into a driver or the OS for `exc` is Keel's
    (or one of LangGraph's savers, which run on Keel's connection); True when no such frame is
    known, so an error without a traceback keeps today's meaning."""
    caller = _innermost_caller(exc.__traceback__)
    if caller is None:
        return True
    return caller.startswith(_KEEL_CODE) and not caller.startswith(_USER_CODE_IN_KEEL)


def _innermost_caller(tb: TracebackType | None) -> str | None:
    modules: list[str] = []
    while tb is not None:
        modules.append(str(tb.tb_frame.f_globals.get("__name__", "")))
        tb = tb.tb_next
    for module in reversed(modules):
        top = module.partition(".")[0]
        if top in _DRIVERS or top in sys.stdlib_module_names:
            continue
        return module + "."
    return None


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Exponential delay with jitter: between half and all of `base` * 2^(attempt-1), capped.

    Jitter spreads a fleet that lost its database at the same instant, so the server that comes
    back is not hit by every worker in the same millisecond.
    """
    ceiling = min(cap, base * 2 ** max(0, attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


OUTLAST = 600.0
"""Seconds a write that records what a provider already answered is tried again through an
outage (`outlast`): a database restart or a failover, not a database gone for good."""


async def outlast(
    write: Callable[[], Awaitable[T]],
    is_outage: Predicate,
    what: str,
    *,
    within: float = OUTLAST,
    stop: asyncio.Event | None = None,
) -> T:
    """`write()`, tried again while it fails for the infrastructure, for up to `within` seconds
    or until `stop` is set (then its failure is raised: a process told to stop stops now, and
    what it heard is reconciled as a dead process's would be). For a write whose loss costs more
    than waiting: the record of a provider's answer, which nothing else can recover but a
    reconciler or a person. The write must be one transaction, fenced (a second try after a
    commit whose reply was lost finds the row no longer its own, and writes nothing)."""
    give_up = time.monotonic() + within
    attempt = 0
    while True:
        try:
            return await write()
        except Exception as exc:
            attempt += 1
            stopped = stop is not None and stop.is_set()
            if stopped or not is_outage(exc) or time.monotonic() >= give_up:
                raise
            pause = min(backoff(attempt, base=0.2, cap=5.0), max(0.0, give_up - time.monotonic()))
            log.warning("%s: database unavailable (%r); again in %.1fs", what, exc, pause)
            if stop is None:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)


@dataclass(frozen=True)
class Attempts:
    """How many failed attempts a run gets before it ends failed, and the backoff between.

    `max_crashes`: executions that failed outside the graph's nodes (the executor, the saver,
    Keel itself), each followed by a backoff. `max_infra_retries`: executions interrupted by an
    infrastructure fault. Both count since the run's admission or its last resume.
    """

    max_crashes: int = 5
    max_infra_retries: int = 20
    backoff: float = 1.0
    max_backoff: float = 60.0

    def __post_init__(self) -> None:
        if self.max_crashes < 1 or self.max_infra_retries < 1:
            raise ValueError("max_crashes and max_infra_retries must be at least 1")
        if self.backoff < 0 or self.max_backoff < self.backoff:
            raise ValueError("backoff must be >= 0 and max_backoff >= backoff")

    def delay(self, attempt: int) -> float:
        return backoff(attempt, base=self.backoff, cap=self.max_backoff)
