"""Batches of runs, measured the same way for each contender.

- no checkpointer: `graph.ainvoke(input)`.
- raw LangGraph: the official async saver (`AsyncSqliteSaver` / `AsyncPostgresSaver`) and
  `ainvoke(input, config, durability="sync")`, one thread per run.
- Keel: `app.submit()`, then a standing in-process worker (concurrency 1) executes the run;
  the time is from just before `submit` to the run's `finished_at`.

Timed measurements take one run per contender per round, so contenders alternate run by run.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langgraph.types import Command

import keel
from bench.common import Databases, Loop, Traffic
from bench.wire import PgCounter, sqlite_counting

GLANCE = 0.002
"""Seconds between looks at the worker's counters while a timed run executes."""
"""Seconds between the observer's looks at a run it waits for (see KeelRunner._wait)."""


class BenchError(RuntimeError):
    pass


class RawRunner:
    """LangGraph with its official async saver and nothing else, on its own database."""

    def __init__(self, loop: Loop, url: str) -> None:
        self.loop = loop
        self.url = url
        self.saver: Any = None
        self._cm: Any = None
        self._graphs: dict[Any, Any] = {}
        self.loop.run(self._open())

    async def _open(self) -> None:
        if self.url.startswith("sqlite:"):
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            self._cm = AsyncSqliteSaver.from_conn_string(self.url.removeprefix("sqlite:///"))
            self.saver = await self._cm.__aenter__()
            await self.saver.setup()
            # Keel's own setting; it is SQLite's default too, so raw gets the same durability.
            await self.saver.conn.execute("PRAGMA synchronous=FULL")
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            self._cm = AsyncPostgresSaver.from_conn_string(self.url)
            self.saver = await self._cm.__aenter__()
            await self.saver.setup()

    def graph(self, factory: Callable[[], Any]) -> Any:
        if factory not in self._graphs:
            self._graphs[factory] = factory().compile(checkpointer=self.saver)
        return self._graphs[factory]

    def one(self, factory: Callable[[], Any], item: Any) -> float:
        return self.batch(factory, [item])

    def batch(self, factory: Callable[[], Any], inputs: Sequence[Any]) -> float:
        """Run each input to the end in its own thread; return the elapsed seconds."""
        graph = self.graph(factory)
        prefix = uuid.uuid4().hex[:8]

        async def go() -> None:
            for i, item in enumerate(inputs):
                config = {"configurable": {"thread_id": f"{prefix}-{i}"}}
                await graph.ainvoke(item, config, durability="sync")

        start = time.perf_counter()
        self.loop.run(go())
        return time.perf_counter() - start

    def approval_batch(self, factory: Callable[[], Any], inputs: Sequence[Any]) -> float:
        """Each run: invoke until `interrupt()`, then `Command(resume=...)` to the end."""
        graph = self.graph(factory)
        prefix = uuid.uuid4().hex[:8]

        async def go() -> None:
            for i, item in enumerate(inputs):
                config = {"configurable": {"thread_id": f"{prefix}-{i}"}}
                await graph.ainvoke(item, config, durability="sync")
                state = await graph.aget_state(config)
                if not state.interrupts:
                    raise BenchError("the raw approval graph did not pause on interrupt()")
                result = await graph.ainvoke(
                    Command(resume={"decision": "approved"}), config, durability="sync"
                )
                if result.get("decision") != "approved":
                    raise BenchError(f"raw approval run ended with {result!r}")

        start = time.perf_counter()
        self.loop.run(go())
        return time.perf_counter() - start

    def close(self) -> None:
        if self._cm is not None:
            self.loop.run(self._cm.__aexit__(None, None, None))
            self._cm = None


class PlainRunner:
    """The same graph without any checkpointer: what the graph itself costs."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self._graphs: dict[Any, Any] = {}

    def one(self, factory: Callable[[], Any], item: Any) -> float:
        return self.batch(factory, [item])

    def batch(self, factory: Callable[[], Any], inputs: Sequence[Any]) -> float:
        if factory not in self._graphs:
            self._graphs[factory] = factory().compile()
        graph = self._graphs[factory]

        async def go() -> None:
            for item in inputs:
                await graph.ainvoke(item)

        start = time.perf_counter()
        self.loop.run(go())
        return time.perf_counter() - start


class KeelRunner:
    """A Keel App on its own database.

    Timed runs go through a standing in-process worker (concurrency 1, started by
    `start_worker`): `one()` submits a run and returns the seconds from just before
    `app.submit` to the run's `finished_at`. The end is seen in the worker's own counters of
    executions that ended (a glance at memory, not a query, and the first one only once the
    run should have ended: nothing competes with the run for the database or the interpreter
    while it executes, as nothing does for raw LangGraph's),
    and the run is then read once, from a second App on the same database.
    Commit counting uses `batch()`: admit a batch, then drain it with a worker that stops
    when idle.
    """

    def __init__(self, dbs: Databases, url: str, **kw: Any):
        self.url = url
        self.dbs = dbs
        self.app = dbs.app(url, **kw)
        self._kw = kw
        self._worker: Any = None
        self._serving: Any = None
        self._observer: keel.App | None = None
        self._prefix = uuid.uuid4().hex[:8]
        self._count = 0
        self._expect: dict[str, float] = {}
        """Seconds the last wait for each status took (see `_wait`)."""

    # -- one run at a time, through a standing worker -------------------------------------------

    def start_worker(self, concurrency: int = 1, observe: bool = True) -> None:
        """Serve runs from a worker on this App's event loop (and watch them from a second App,
        unless `observe` is false: an idle worker's traffic is measured alone)."""
        from keel.runtime.worker import Worker

        rt = self.app.aio.runtime
        rt.portal.call(rt.open())
        self._worker = Worker(rt, concurrency=concurrency)
        self._serving = asyncio.run_coroutine_threadsafe(self._worker.run(), rt.portal.loop)
        if observe:
            self._observer = self.dbs.app(self.url, **self._kw)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the worker runs on."""
        return self.app.aio.runtime.portal.loop

    def drain_here(self, concurrency: int) -> Any:
        """Run the queue dry with a worker on this App's loop; the caller blocks, polling
        nothing. Returns the worker's stats."""
        from keel.runtime.worker import Worker

        rt = self.app.aio.runtime
        rt.portal.call(rt.open())
        worker = Worker(rt, concurrency=concurrency, stop_when_idle=True)
        return asyncio.run_coroutine_threadsafe(worker.run(), rt.portal.loop).result(timeout=600)

    def stop_worker(self) -> None:
        if self._worker is not None:
            self.app.aio.runtime.portal.loop.call_soon_threadsafe(self._worker.stop)
            self._serving.result(timeout=120)
            self._worker = None
        if self._observer is not None:
            self._observer.close()
            self._observer = None

    def _submit_one(self, workflow: str, item: Any) -> str:
        self._count += 1
        job = f"one-{self._prefix}-{self._count}"
        self.app.submit(workflow, job_id=job, input=item)
        return job

    def _ended(self) -> int:
        """Executions the standing worker has ended, however they ended."""
        stats = self._worker.stats
        return int(stats.finished + stats.waiting + stats.lost)

    def _wait(self, job: str, status: str, ended: int, timeout: float = 120) -> dict[str, Any]:
        """The run of `job` once an execution after the `ended`-th has ended and left it in
        `status` (a BenchError if it ended otherwise).

        The first glance comes once the time the last run took to reach `status` from here (by
        its own timestamp) has passed again, and a tenth: a glance takes the interpreter from
        the run for a moment, and glances every `GLANCE` while it executed took 3-6% of its time
        (interleaved A/B, 150 runs each backend)."""
        assert self._observer is not None, "start_worker() first"
        began = time.time()
        deadline = time.monotonic() + timeout
        time.sleep(min(self._expect.get(status, 0.0) * 1.1, 1.0))
        while time.monotonic() < deadline:
            if self._ended() > ended:
                rows = self._observer.list_runs(job_id=job, limit=1)
                if rows and rows[0]["status"] == status:
                    at = rows[0]["finished_at"] or rows[0]["updated_at"]  # the run's own time
                    self._expect[status] = max(0.0, float(at) - began)
                    return rows[0]
                if rows and rows[0]["status"] in ("failed", "cancelled"):
                    row = rows[0]
                    raise BenchError(f"run of job {job} ended {row['status']}: {row['error']}")
                ended = self._ended()  # another execution ended (a retry): wait for the next
            # The time is the run's own timestamps, not when this loop sees the end.
            time.sleep(GLANCE)
        raise BenchError(f"run of job {job} did not become {status} in {timeout:.0f} s")

    def one(self, workflow: str, item: Any) -> float:
        """Seconds from submitting one run to its `finished_at` (admission included)."""
        ended = self._ended()
        start = time.time()
        job = self._submit_one(workflow, item)
        row = self._wait(job, "completed", ended)
        return float(row["finished_at"]) - start

    def one_approval(self) -> float:
        """One approval cycle, without the time the approver takes to answer.

        (submit -> the run is waiting) + (app.approve -> the run is completed), from the
        run's own timestamps.
        """
        ended = self._ended()
        start = time.time()
        job = self._submit_one("approval", {"n": 0})
        waiting = self._wait(job, "waiting", ended)
        to_wait = float(waiting["updated_at"]) - start
        ended = self._ended()
        decided = time.time()
        if not self.app.approve(waiting["run_id"], by="bench").recorded:
            raise BenchError(f"run {waiting['run_id']}: the approval was not recorded")
        done = self._wait(job, "completed", ended)
        if done["decision"] != "approved":
            raise BenchError(f"run {done['run_id']} ended with decision {done['decision']}")
        return to_wait + float(done["finished_at"]) - decided

    # -- batches (commit counting) ----------------------------------------------------------------

    def submit(self, workflow: str, inputs: Sequence[Any]) -> list[str]:
        prefix = uuid.uuid4().hex[:8]
        return [
            self.app.submit(workflow, job_id=f"bench-{prefix}-{i}", input=item)["run_id"]
            for i, item in enumerate(inputs)
        ]

    def drain(self, expect: int, ending: str = "finished") -> None:
        """Run the queue dry; `expect` runs must end their execution `finished` or `waiting`."""
        stats = self.app.run_worker(concurrency=1, stop_when_idle=True, handle_signals=False)
        if getattr(stats, ending) != expect:
            raise BenchError(f"the worker's runs ({stats}): expected {expect} {ending}")

    def batch(self, workflow: str, inputs: Sequence[Any]) -> tuple[float, float]:
        """Admit the inputs, then drain them; return (admission s, execution s)."""
        start = time.perf_counter()
        self.submit(workflow, inputs)
        admitted = time.perf_counter()
        self.drain(len(inputs))
        return admitted - start, time.perf_counter() - admitted

    def approval_batch(self, inputs: Sequence[Any]) -> tuple[float, float]:
        """submit -> run to the approval -> approve -> resume -> done; (admission s, rest s)."""
        start = time.perf_counter()
        run_ids = self.submit("approval", inputs)
        admitted = time.perf_counter()
        self.drain(len(inputs), "waiting")
        for run_id in run_ids:
            if not self.app.approve(run_id, by="bench").recorded:
                raise BenchError(f"run {run_id}: the approval was not recorded")
        self.drain(len(inputs))
        elapsed = time.perf_counter() - admitted
        last = self.app.get_run(run_ids[-1])
        if last.status != "completed" or last.decision != "approved":
            raise BenchError(f"run {run_ids[-1]} ended {last.status}/{last.decision}")
        return admitted - start, elapsed

    def close(self) -> None:
        self.stop_worker()
        self.app.close()


def traffic_per_run(url: str, run: Callable[[int, str], None], small: int, large: int) -> Traffic:
    """Database traffic per run, from two batches of different sizes.

    `run(n, url)` opens a fresh client on the URL it is given, runs n runs and closes the
    client. SQLite: every connection opened on the file meanwhile is traced. PostgreSQL: the
    client is given a URL through a counting proxy (bench.wire), so only its own traffic is
    seen. The difference of the two batches cancels what each pays once (connecting, a
    worker's start and stop).
    """
    found: list[Traffic] = []
    for n in (small, large):
        if url.startswith("sqlite:"):
            with sqlite_counting(url.removeprefix("sqlite:///")) as trace:
                run(n, url)
            c = trace.snapshot()
            _counted_something(c.connections, url)
            found.append(
                Traffic(
                    "sqlite",
                    {"statements": c.statements, "commits": c.commits, "durable": c.durable},
                )
            )
        else:
            with PgCounter(url) as counter:
                run(n, counter.url(url))
                p = counter.snapshot()
            _counted_something(p.connections, url)
            found.append(
                Traffic(
                    "postgres",
                    {
                        "round_trips": p.round_trips,
                        "pool_checks": p.pool_checks,
                        "transactions": p.transactions,
                        "durable": p.writing,
                    },
                )
            )
    return (found[1] - found[0]).scaled(1 / (large - small))


def _counted_something(connections: int, url: str) -> None:
    # Zero would be a client that connects some way the counters do not see (a SQLite
    # connection not opened through sqlite3.connect, a URL not taken): no figure, not "0".
    if connections == 0:
        raise BenchError(f"no connection to {url} was counted: the bench's counters missed it")
