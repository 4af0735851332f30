"""How the sync App is made from the async one, declared once per operation.

`submit = sync_of(AsyncApp.submit)` on the App is the whole sync `submit`: the descriptor hands
the coroutine to the App's portal (keel.core.portal) and keeps the async twin's name,
docstring, parameters and return type. Its type is built from the twin's (`ParamSpec`), so a
type checker holds the two faces equal and sees `App().submit(...)` return a `Submission`,
not an awaitable; no signature is written twice.

A worker or a dispatcher stops on SIGTERM/SIGINT (`stop_on_signals`). Called through the App,
its coroutine runs on the portal's thread, where no signal arrives: the App's calling thread
takes them (`relay_signals=True`) and hands each one to the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import signal
import threading
import types
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from keel.core.portal import Portal

P = ParamSpec("P")
R = TypeVar("R")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Facade(Protocol):
    """What the descriptor needs of the sync App: its async twin, whose runtime's portal runs
    the coroutines."""

    @property
    def aio(self) -> Any: ...


class sync_of(Generic[P, R]):  # used like a function, at class level
    """The sync form of an `AsyncApp` operation, on the App (see the module's docstring)."""

    def __init__(
        self,
        operation: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
        *,
        relay_signals: bool = False,
    ) -> None:
        """`relay_signals`: the call's `handle_signals` (default True) lets the calling thread
        take SIGTERM/SIGINT for the operation (a worker, a dispatcher)."""
        name = operation.__name__

        @functools.wraps(operation)
        def call(app: Facade, /, *args: Any, **kwargs: Any) -> Any:
            portal: Portal = app.aio.runtime.portal
            coro = getattr(app.aio, name)(*args, **kwargs)
            if not (relay_signals and kwargs.get("handle_signals", True)):
                return portal.call(coro)
            with _Relay().installed() as context:
                return portal.call(coro, context=context)

        self.function = call

    @overload
    def __get__(self, app: None, owner: type) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, app: object, owner: type) -> Callable[P, R]: ...

    def __get__(self, app: object, owner: type) -> Callable[..., R]:
        if app is None:
            return self.function  # a plain function, as `inspect` and the parity test expect
        return types.MethodType(self.function, app)


_relay: contextvars.ContextVar[_Relay | None] = contextvars.ContextVar("keel_relay", default=None)


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None], *, enabled: bool = True) -> Iterator[None]:
    """Call `stop()` on the running loop at each SIGTERM/SIGINT while inside: through the App's
    calling thread (a sync call), or the loop's own handlers when it runs on the main thread;
    elsewhere only signals' default handling applies, and the caller stops the work itself."""
    loop = asyncio.get_running_loop()
    relay = _relay.get() if enabled else None
    if relay is not None:
        with relay.routing(loop, stop):
            yield
        return
    handled = []
    if enabled and threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            loop.add_signal_handler(sig, stop)
            handled.append(sig)
    try:
        yield
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


class _Relay:
    """The App's calling thread takes the signals and hands each one to the loop; one that
    comes before the work is ready to stop is handed over when it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: tuple[asyncio.AbstractEventLoop, Callable[[], None]] | None = None
        self._early = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[contextvars.Context | None]:
        if threading.current_thread() is not threading.main_thread():
            yield None  # only the main thread may take signals; the caller stops the work
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        context = contextvars.copy_context()
        context.run(_relay.set, self)
        try:
            yield context
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        with self._lock:
            if self._target is None:
                self._early += 1
                return
            loop, stop = self._target
        loop.call_soon_threadsafe(stop)

    @contextlib.contextmanager
    def routing(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> Iterator[None]:
        with self._lock:
            self._target, early, self._early = (loop, stop), self._early, 0
        for _ in range(early):
            stop()
        try:
            yield
        finally:
            with self._lock:
                self._target = None
