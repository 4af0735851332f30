"""Provider calls with a deadline: a caller that stops waiting, and what it leaves running.

An async call is cancelled at its deadline. A sync call cannot be interrupted, so a sync
effect that declares a timeout runs in a daemon thread of its own and its caller stops waiting
(`Abandoned`); the thread runs on until the provider answers, and its `Pending` tells whoever
must decide about the key whether it is still under way, and how it ended. Nothing here talks
to the ledger: keel.core.effects.ledger and keel.core.effects.dispatch decide what an abandoned call
means for a key or an intent.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any


class Pending:
    """A sync provider call running in a thread of its own."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self._outcome: tuple[bool, Any] | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def settle(self, ok: bool, value: Any) -> None:
        with self._lock:
            self._outcome = (ok, value)
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call `callback()` once the call ended (in its thread; at once if it has)."""
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def outcome(self) -> tuple[bool, Any] | None:
        """(True, result) or (False, exception) once the call ended; None while under way."""
        return self._outcome if self.done.is_set() else None


class Abandoned(Exception):
    """A provider call outlived its effect's timeout: the caller stopped waiting, and what the
    provider did is unknown. `running` is the call's thread when it may still be under way
    (a sync call), None when nothing of it runs any more (a cancelled coroutine, or a call
    never started because its deadline was spent)."""

    def __init__(self, running: Pending | None = None) -> None:
        super().__init__("the provider call outlived its timeout")
        self.running = running


def spawn(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Pending:
    """Start `fn(*args, **kwargs)` in a daemon thread (in a copy of this context)."""
    pending = Pending()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome: tuple[bool, Any] = (True, context.run(fn, *args, **kwargs))
        except BaseException as exc:  # handed to whoever waits for it
            outcome = (False, exc)
        pending.settle(*outcome)

    name = f"keel-effect-{getattr(fn, '__name__', 'call')}"
    threading.Thread(target=run, name=name, daemon=True).start()
    return pending


def call_within(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], seconds: float
) -> Any:
    """`fn(*args, **kwargs)`, waited for at most `seconds` by this (blocking) thread, else
    Abandoned with the call's thread (never started if `seconds` is spent already)."""
    if seconds <= 0:
        raise Abandoned
    pending = spawn(fn, args, kwargs)
    if not pending.done.wait(seconds):
        raise Abandoned(pending)
    ok, value = pending.outcome() or (False, RuntimeError("no outcome"))
    if ok:
        return value
    raise value


async def in_own_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a thread of its own, awaited: a caller that stops awaiting (a
    timeout) leaves the thread to finish on its own; see `within` for its Pending."""
    return await within(spawn(fn, args, kwargs))


async def within(pending: Pending) -> Any:
    """Await a spawned call's outcome from the event loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle() -> None:
        if future.done():
            return  # abandoned meanwhile
        ok, value = pending.outcome() or (False, RuntimeError("no outcome"))
        if ok:
            future.set_result(value)
        elif isinstance(value, StopIteration):  # a Future refuses it: say what it was
            future.set_exception(RuntimeError(f"the call raised {value!r}"))
        else:
            future.set_exception(value)

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while the provider took
            loop.call_soon_threadsafe(settle)

    pending.when_done(wake)
    return await future


TOKEN_KEYWORDS = ("fencing_token", "lease_token")
"""The keywords under which an effect (or its reconciler) takes the run's or claim's token."""


def token_keyword(fn: Callable[..., Any] | None) -> str | None:
    """The keyword under which `fn` takes the fencing token, if it takes it."""
    try:
        params = inspect.signature(fn).parameters if fn is not None else {}
    except (TypeError, ValueError):  # a callable Python cannot describe takes none
        return None
    return next((k for k in TOKEN_KEYWORDS if k in params), None)


async def call_with_token(fn: Callable[..., Any], token: int, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, given the claim's `token` if it takes `fencing_token` (or
    `lease_token`); a sync `fn` in a thread of its own."""
    name = token_keyword(fn)
    if name is not None:
        kwargs[name] = token  # the claim's token: a provider may refuse a stale dispatcher
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    # A thread of its own, not the loop's pool: a call abandoned at its deadline runs on
    # until its provider answers, and must not hold a thread other work needs.
    return await in_own_thread(fn, *args, **kwargs)


TIMED_OUT: Any = object()
"""A delivery's call outlived its effect's timeout: its outcome is unknown."""
NOT_CALLED: Any = object()
"""A delivery's deadline was spent before its call could start: nothing was called."""
STILL_RUNNING: Any = object()
"""A sync delivery's thread still waits on its provider twice its timeout after it started."""


async def call_by_deadline(
    fn: Callable[..., Any],
    token: int,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    declared_timeout: float | None,
    asked_at: float,
    grace: float,
) -> Any:
    """A delivery's provider call, bounded by its effect's `declared_timeout` counted from
    `asked_at` (before the look that armed it: never later than the deadline the database
    holds); TIMED_OUT, NOT_CALLED or STILL_RUNNING when it did not answer. An effect that
    declares none (None) is never abandoned: the app's default only sets that deadline. A sync
    call that outlives its timeout is waited for `grace` more seconds (its caller holding the
    claim): while its thread can still reach the provider, nobody may reconcile it."""
    if declared_timeout is None:
        return await call_with_token(fn, token, *args, **kwargs)
    call_timeout = declared_timeout
    remaining = call_timeout - (time.monotonic() - asked_at)
    if remaining <= 0:
        return NOT_CALLED
    if inspect.iscoroutinefunction(fn):
        async with asyncio.timeout(remaining) as deadline:
            try:
                return await call_with_token(fn, token, *args, **kwargs)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if deadline.expired() and (task is None or task.cancelling() <= 1):
                    return TIMED_OUT
                raise
    running = spawn(_with_token(fn, token), args, kwargs)
    for wait in (remaining, grace):
        if await _ended_within(running, wait):
            break
    else:
        return STILL_RUNNING
    ok, value = running.outcome() or (False, RuntimeError("no outcome"))
    if ok:
        return value
    raise value


async def _ended_within(running: Pending, seconds: float) -> bool:
    """Whether the call's thread ended within `seconds` (waited for from the loop)."""
    async with asyncio.timeout(seconds) as deadline:
        try:
            await within(running)
        except asyncio.CancelledError:
            if deadline.expired():
                return False
            raise
        except BaseException:
            pass  # it ended, raising: its outcome says how
    return True


def _with_token(fn: Callable[..., Any], token: int) -> Callable[..., Any]:
    """`fn` with the claim's token passed as its `fencing_token`/`lease_token`, if it takes one."""
    name = token_keyword(fn)
    return fn if name is None else functools.partial(fn, **{name: token})
