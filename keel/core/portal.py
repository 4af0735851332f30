"""The thin sync facade's engine: one event loop in a background thread, owned by the App.

Keel's core is async. Sync callers (scripts, the CLI, sync LangGraph nodes running in worker
threads) hand coroutines to this loop and wait for the result. A caller *on* the loop must
await instead; doing otherwise would deadlock, so it gets a clear error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from keel.core.errors import UsageError

T = TypeVar("T")

hop_inline: contextvars.ContextVar[bool] = contextvars.ContextVar("keel_hop_inline", default=False)
"""Set where a hop to the loop's threads costs more than the work it moves (keel.langgraph.
recording: upstream's saver serializing a small checkpoint's values with `asyncio.to_thread`)."""


class LoopThreads(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor: a thread per blocking call, but for a call submitted where
    `hop_inline` is set, which runs at once on the submitting thread. A hop is a pool thread's
    wake-up and a second trip through the loop, and it gives the GIL to another thread: for
    microseconds of work, on a loop busy with other runs, the hop is nearly all of the cost."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if not hop_inline.get():
            return super().submit(fn, *args, **kwargs)
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the caller's await raises it, as it would from a thread
            done.set_exception(exc)
        return done


class Portal:
    def __init__(self, name: str = "keel-loop") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether the loop runs (it starts at the first call, and stops at `close`)."""
        return self._loop is not None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                loop = asyncio.new_event_loop()

                # Sync LangGraph nodes run in the loop's default executor; keep it roomy.
                loop.set_default_executor(LoopThreads(64, thread_name_prefix="keel-node"))

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    ready.set()
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    def on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def call(
        self,
        coro: Coroutine[Any, Any, T] | Callable[[Host], Coroutine[Any, Any, T]],
        *,
        context: contextvars.Context | None = None,
    ) -> T:
        """Run a coroutine on the portal's loop (in `context`, if given) and wait for it.

        Given a factory instead of a coroutine, the factory receives a `Host`: the coroutine can
        `await host.run(fn, ...)` to run a blocking function back in *this* calling thread, so
        a sync node's effect runs in the node's own thread and needs no extra pool thread.
        """
        loop = self.loop
        if self.on_loop():
            if asyncio.iscoroutine(coro):
                coro.close()
            raise UsageError(
                "a blocking Keel call was made on Keel's event loop; await the async API instead "
                "(or make the node a plain `def`)"
            )
        inbox: queue.Queue[tuple[Any, ...]] = queue.Queue()
        host = Host(loop, inbox)
        work = coro if asyncio.iscoroutine(coro) else coro(host)

        def start() -> None:
            task = loop.create_task(work, context=context)
            task.add_done_callback(lambda t: inbox.put(("done", t)))

        loop.call_soon_threadsafe(start)
        while True:
            try:
                # Wait in slices so the main thread still runs signal handlers (SIGTERM).
                message = inbox.get(timeout=0.25)
            except queue.Empty:
                continue
            if message[0] == "call":
                _, fn, args, kwargs, reply = message
                host.answer(reply, fn, args, kwargs)
                continue
            task = message[1]
            if task.cancelled():
                raise concurrent.futures.CancelledError()
            exc = task.exception()
            if exc is not None:
                raise exc
            return task.result()

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        if loop.is_running() and not loop.is_closed():
            # What still runs (a sync node's effect whose execution was cancelled past a
            # worker's grace, waiting on its thread) is cancelled and let finish, as
            # asyncio.run does: destroyed pending, it would leave an asyncio ERROR and hold
            # nothing more (its key is settled by its deadline, docs/workers.md).
            ended = asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop)
            with contextlib.suppress(Exception):
                ended.result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)
        if not loop.is_running():
            loop.close()


async def _cancel_the_rest() -> None:
    here = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not here]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)


class Host:
    """The thread blocked in `Portal.call`, lent to the coroutine for blocking calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop, inbox: queue.Queue[tuple[Any, ...]]):
        self._loop = loop
        self._inbox = inbox

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        reply: asyncio.Future[T] = self._loop.create_future()
        self._inbox.put(("call", fn, args, kwargs, reply))
        return await reply

    def answer(
        self, reply: asyncio.Future[Any], fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> None:
        def settle(outcome: tuple[bool, Any]) -> None:
            if reply.done():
                return
            ok, value = outcome
            if ok:
                reply.set_result(value)
            else:
                reply.set_exception(value)

        try:
            outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as exc:  # handed back to the awaiting coroutine
            outcome = (False, exc)
        self._loop.call_soon_threadsafe(settle, outcome)
