"""`keel.AsyncApp` (`app.aio`): every operation on runs, as coroutines (threads' in
keel.runtime.conversations, the fleet's, waits' and the outbox's in keel.runtime.oversight,
approvals' and in-doubt effects' answers in keel.runtime.answers, mixed in).

It composes a `Runtime` (keel.runtime.runtime: the parts, open/close, wake-ups, the hand-off to a
worker of this process) and calls the core's commands and the store over its services. The sync
`keel.App` declares each of these once more as `sync_of(AsyncApp.<name>)` (keel.runtime.facade):
the same name, parameters, return type and docstring.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypedDict, Unpack

from keel.core import failed_runs, retention, runs, threads, timers
from keel.core.artifacts import RunArtifacts
from keel.core.errors import (
    DecisionConflict,
    NoPendingWait,
    RunNotFound,
    UsageError,
)
from keel.core.ids import validate_run_id
from keel.core.store.base import Row
from keel.core.store.run_queries import RunFilters
from keel.langgraph import traces
from keel.langgraph.inputs import check_input
from keel.runtime import inbound, webhooks
from keel.runtime import replay as replays
from keel.runtime.answers import Answers
from keel.runtime.conversations import ThreadOperations
from keel.runtime.dispatcher import deliver_effects
from keel.runtime.facade import stop_on_signals
from keel.runtime.handoff import Reserved
from keel.runtime.oversight import Oversight
from keel.runtime.records import RunDetails, Submission
from keel.runtime.replay import ReplayReport
from keel.runtime.runtime import Runtime
from keel.runtime.schedules import AsyncSchedules
from keel.runtime.summary import RunSummary, summarize
from keel.runtime.worker import DEFAULT_CONCURRENCY, Worker, WorkerStats, new_worker_id

log = logging.getLogger("keel.runtime")


class RunListing(TypedDict, total=False):
    """How `list_runs` and `browse_runs` filter runs, and their page."""

    status: str | None
    workflow: str | None
    since: float | str | None
    """Admitted at or after: epoch seconds, an age (2h, 7d) or an ISO time."""
    until: float | str | None
    """Admitted before (the same forms)."""
    limit: int
    offset: int


NOTHING: Any = object()
"""`resume` without a value (a failed run's resume), apart from resuming with None."""


class AsyncApp(ThreadOperations, Oversight, Answers):
    runtime: Runtime
    """The parts this app runs on (its store, services, workflows, portal): for the CLI, the
    service, the chaos tools and tests, not an operation on runs."""

    def __init__(self, url: str, **options: Any) -> None:
        """`url` and the options of `keel.runtime.runtime.Runtime` (clock, artifacts_root,
        lease_ttl, heartbeat_interval, max_input_bytes, portal, attempts, effect_timeout)."""
        self.runtime = Runtime(url, **options)
        self.schedules = AsyncSchedules(self.runtime)
        """Crons and intervals that start runs (docs/schedules.md)."""

    # -- lifetime and schema ------------------------------------------------------------------

    async def open(self, *, check_schema: bool = True) -> None:
        """Connect (every operation does it first); SchemaMismatch unless the database is at
        the schema this Keel needs (`check_schema`)."""
        await self.runtime.open(check_schema=check_schema)

    async def close(self) -> None:
        """Close the database connections (the next operation opens them again)."""
        await self.runtime.close()

    async def migrate(self) -> list[str]:
        """Apply Keel's migrations and the LangGraph savers' setup; what was applied."""
        return await self.runtime.migrate()

    async def schema_version(self) -> int:
        """The database's schema version (0: never migrated); see `latest_schema_version`."""
        return await self.runtime.schema_version()

    @property
    def latest_schema_version(self) -> int:
        """The schema version this Keel needs."""
        return self.runtime.latest_schema_version

    # -- runs --------------------------------------------------------------------------------

    async def submit(
        self,
        workflow: str,
        input: Any = None,
        *,
        job_id: str | None = None,
        thread_id: str | None = None,
        command: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        context: Any = None,
        checkpoint_id: str | None = None,
        multitask_strategy: str = "enqueue",
        metadata: dict[str, Any] | None = None,
        version: str | None = None,
        rerun: bool = False,
        if_exists: str = "reuse",
        after: timers.Duration | None = None,
        not_before: datetime | float | None = None,
        webhook: str | None = None,
        webhook_on: Iterable[str] | None = None,
        webhook_format: str = "keel",
        merge_metadata: dict[str, Any] | None = None,
        end_paused: bool = False,
        if_not_exists: str = "create",
    ) -> Submission:
        """Admit a run, durably, before any of it executes.

        With a `job_id` and no thread, admission is idempotent (the same job, input and version
        return the same run); when the job already has runs with other input (`other_runs`),
        `if_exists` says what to do: "reuse" (the default) returns the job's latest run, "new"
        admits this one too, "error" raises JobExists. Without a job id each call is a run.

        With a `thread_id` (created if new, its `metadata` kept; with `if_not_exists="reject"`
        a missing thread raises ThreadNotFound instead, judged in the admission's transaction,
        so a thread deleted meanwhile is not made again) the run is a turn of that
        conversation: it starts from the thread's latest checkpoint (or the past
        `checkpoint_id` it forks from) and merges `input` through the graph's reducers, or
        starts with `command` (LangGraph's Command: `update`/`goto`; `resume` answers the
        interrupt the thread waits on instead, as `resume_thread`). One run of a thread is
        active at a time; `multitask_strategy` says what this one does if another is
        unfinished: "enqueue" (run after it), "reject" (ThreadBusy), "interrupt" (stop it at
        its next step boundary and go on from there) or "rollback" (stop it and discard its
        checkpoints). `config` (its `configurable` and `metadata`) and `context` reach the
        graph as in LangGraph.

        `after` (seconds, a timedelta or "5m") or `not_before` (an aware datetime or epoch
        seconds) delay the run: admitted now, durable and queued, it is not claimed before that
        time by the database's clock; on a thread it keeps its place in the thread's order.

        `webhook`: a URL told, signed and at least once under one delivery id, when the run
        ends for one of `webhook_on` (default completed, failed, cancelled, timed_out; add
        "interrupted" for its pauses); refused here (WebhookRefused) without a signing secret
        or for a private address not allowed. `webhook_format`: the body, Keel's run summary
        ("keel") or the Agent Server protocol's run ("agent_server"); docs/webhooks.md.

        `merge_metadata` (with a `thread_id`): keys merged into the thread's metadata, new or
        existing, in the admission's own transaction (the Agent Server stamps `graph_id` and
        `assistant_id` so), where `metadata` only names a new thread's. `end_paused`: LangGraph
        Platform's view of a thread, where a run paused on `interrupt()` has returned: this new
        run (not a resume) ends such a run of the thread instead of queueing behind it
        (docs/threads.md)."""
        delay, start_at = timers.start_time(after, not_before)
        await self.open()
        hook = None
        if webhook is not None:
            settings = self.runtime.services.webhooks
            events = await asyncio.to_thread(
                webhooks.check, settings, webhook, webhook_on, webhook_format
            )
            hook = (webhook, events, webhook_format)
        submitted = await self._submit(
            workflow,
            input,
            job_id=job_id,
            thread_id=thread_id,
            command=command,
            config=config,
            context=context,
            checkpoint_id=checkpoint_id,
            multitask_strategy=multitask_strategy,
            metadata=metadata,
            version=version,
            rerun=rerun,
            if_exists=if_exists,
            delay=delay,
            start_at=start_at,
            merge_metadata=merge_metadata,
            end_paused=end_paused,
            if_not_exists=if_not_exists,
        )
        if hook is not None:
            await webhooks.register(
                self.runtime.store, self.runtime.services.webhooks, submitted.run_id, *hook
            )
        return submitted

    async def _submit(
        self,
        workflow: str,
        input: Any,
        *,
        job_id: str | None,
        thread_id: str | None,
        command: dict[str, Any] | None,
        config: dict[str, Any] | None,
        context: Any,
        checkpoint_id: str | None,
        multitask_strategy: str,
        metadata: dict[str, Any] | None,
        version: str | None,
        rerun: bool,
        if_exists: str,
        delay: float | None,
        start_at: float | None,
        merge_metadata: dict[str, Any] | None = None,
        end_paused: bool = False,
        if_not_exists: str = "create",
    ) -> Submission:
        if if_not_exists not in ("create", "reject"):
            raise UsageError(f"if_not_exists must be create or reject, not {if_not_exists!r}")
        if if_not_exists == "reject" and thread_id is None:
            raise UsageError("if_not_exists reject asks for an existing thread: give thread_id")
        wf = self.runtime.workflows.get(workflow, version)
        self.runtime.check(wf)  # refused before admission: a run of it could never execute
        command = threads.validate_command(command)
        if command is not None and "resume" in command:
            if thread_id is None:
                raise UsageError("a resume command answers a thread's interrupt: give thread_id")
            try:
                # As `resume`: DecisionConflict if another answer won (nothing hidden).
                return Submission(await self.resume(thread_id, command["resume"]), created=False)
            except NoPendingWait:
                # Asked only now: a waiting run, the common case, costs no read more.
                if not await self.paused_without_run(thread_id):
                    raise
            # No run waits (a state update ended it): a new run resumes the checkpoint, as
            # LangGraph's Command(resume=...) does; `reject`, so that of two answers racing
            # here one is admitted and the other refused (ThreadBusy), as a wait's are.
            multitask_strategy, end_paused = "reject", False
        if merge_metadata is not None and thread_id is None:
            raise UsageError("merge_metadata is merged into a thread's metadata: give thread_id")
        if thread_id is not None or command or config or context is not None or checkpoint_id:
            return await self._submit_on_thread(
                wf,
                input,
                thread_id=thread_id,
                command=command,
                config={
                    **(config or {}),
                    **({"context": context} if context is not None else {}),
                },
                checkpoint_id=checkpoint_id,
                strategy=multitask_strategy,
                metadata=metadata,
                job_id=job_id,
                delay=delay,
                not_before=start_at,
                merge_metadata=merge_metadata,
                end_paused=end_paused,
                create=if_not_exists == "create",
            )
        if job_id is None:
            job_id = threads.new_id()
        # A delayed run is not handed to a worker of this process: no claim can take it yet.
        taker, claim = self.runtime.taker() if delay is None and start_at is None else (None, None)
        slot = Reserved(taker) if taker is not None else None
        try:
            admitted = await runs.admit(
                self.runtime.store,
                workflow=wf.name,
                version=wf.version,
                job_id=job_id,
                input=input,
                rerun=rerun,
                max_input_bytes=self.runtime.max_input_bytes,
                if_exists=if_exists,
                check=functools.partial(check_input, wf),
                then=claim,
                delay=delay,
                not_before=start_at,
            )
            if admitted.created:
                await self._trace(admitted.row)  # before the worker it goes to can start it
            if slot is not None:
                await slot.adopt(admitted.then)
        finally:
            if slot is not None:
                slot.give_back()
        handed = admitted.then is not None and admitted.then["run_id"] == admitted.row["run_id"]
        if admitted.created and not handed:  # a worker here took it: nothing to wake for
            self.runtime.wake()
        return Submission(admitted.row, created=admitted.created, other_runs=admitted.other_runs)

    async def accept_hook_delivery(
        self, hook: str, delivery_id: str, *, workflow: str, job_id: str, input: Any
    ) -> tuple[str, bool]:
        """Admit the run of a verified inbound webhook delivery once per delivery id (decided
        by the database); its run id and whether the delivery was seen before."""
        await self.open()
        return await inbound.accept(
            self.runtime.store,
            self.submit,
            hook,
            delivery_id,
            workflow=workflow,
            job_id=job_id,
            input=input,
        )

    async def _trace(self, row: Row) -> None:
        """Root the new run's trace here, linked to the submitter's span (keel.langgraph.traces);
        a failure only leaves it to the first worker."""
        tracer = traces.active()
        if tracer is None:
            return
        try:
            await tracer.root(self.runtime.store, row, by="submit")
        except Exception as exc:
            log.warning("run %s: could not keep its trace context (%r)", row["run_id"], exc)

    async def get_run(self, run_id: str) -> RunDetails:
        """Everything known about the run (RunNotFound if none): its row, timeline, effects,
        waits, artifacts, notifications, intents and whether it is stranded."""
        await self.open()
        validate_run_id(run_id)
        run = await self.runtime.store.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        for_run = RunArtifacts(self.runtime.artifacts_root, run_id).list()
        return RunDetails(
            run=run,
            timeline=await self.runtime.store.events(run_id),
            effects=await self.runtime.store.effects(run_id),
            waits=await self.runtime.store.waits(run_id),
            artifacts=for_run,
            notifications=await self.runtime.store.notifications(run_id),
            intents=await self.runtime.store.list_intents(run_id=run_id, limit=100_000),
            stranded_reason=(await self._served()).reason(run),
        )

    async def list_runs(
        self, *, job_id: str | None = None, **filters: Unpack[RunListing]
    ) -> list[Row]:
        """Runs, newest first, each with its derived `stranded` flag; `since` and `until`
        (admission time, until excluded) take epoch seconds, ages (2h, 7d) or ISO times."""
        await self.open()
        rows = await self.runtime.store.list_runs(job_id=job_id, **await self._moments(filters))
        serving = await self._served()
        for row in rows:
            row["stranded"] = serving.is_stranded(row)
        return rows

    async def database_now(self) -> float:
        """The database's clock, which judges every lease and deadline (epoch seconds)."""
        await self.open()
        return await self.runtime.store.database_now()

    async def browse_runs(
        self, *, job_prefix: str | None = None, **filters: Unpack[RunListing]
    ) -> list[Row]:
        """Runs newest first, each with its `pending_waits`; `job_prefix` matches the job ids
        that start with it, the other filters are `list_runs`'s."""
        await self.open()
        moments = await self._moments(filters)
        rows = await self.runtime.store.browse_runs(job_prefix=job_prefix, **moments)
        counts = await self.runtime.store.count_pending_waits([r["run_id"] for r in rows])
        for row in rows:
            row["pending_waits"] = counts.get(row["run_id"], 0)
        return rows

    async def cancel(self, run_id: str, *, by: str | None = None) -> Row:
        """Cancel a run: queued or waiting at once, running at its next step boundary."""
        await self.open()
        validate_run_id(run_id)
        return await runs.cancel(self.runtime.store, run_id, by=by)

    async def resume(
        self, target: str, value: Any = NOTHING, *, by: str | None = None, **answer: Any
    ) -> Row:
        """`resume(thread_id, value)`: answer the interrupt the thread's active run waits on
        with `value` (LangGraph's `Command(resume=value)`; DecisionConflict if another answer
        won first). `resume(run_id)`: queue a failed run again, to continue from its last
        checkpoint with its ledger. Either way, the run's row."""
        await self.open()
        if value is not NOTHING:
            result = await self.resume_thread(target, value, by=by, **answer)
            retried = answer.get("action_id") and result.wait["action_id"] == answer["action_id"]
            if not result.recorded and not retried:
                raise DecisionConflict(
                    f"wait {result.wait['wait_id']} was already answered "
                    f"({result.wait['decision']} by {result.wait['decided_by'] or 'someone'})"
                )
            row = await self.runtime.store.get_run(str(result.wait["run_id"]))
            assert row is not None
            return row
        validate_run_id(target)
        row = await failed_runs.resume(self.runtime.store, target, by=by)
        self.runtime.wake()
        return row

    async def _moments(self, filters: RunListing) -> RunFilters:
        """The filters with `since`/`until` as epoch seconds (ages and ISO times read against
        the database's clock)."""
        found = RunFilters(**{k: v for k, v in filters.items() if k not in ("since", "until")})  # type: ignore[typeddict-item]
        if filters.get("since") is not None or filters.get("until") is not None:
            now = await self.runtime.store.database_now()
            found["since"] = retention.parse_moment(filters.get("since"), now)
            found["until"] = retention.parse_moment(filters.get("until"), now)
        return found

    async def summary(self, run_id: str) -> RunSummary:
        """The run's outcome and why, per-node timing, attempts (keel.runtime.summary)."""
        return summarize(await self.get_run(run_id), await self.database_now())

    async def run_dispatcher(self, *, handle_signals: bool = True) -> None:
        """Deliver outbox effects (every worker does it too) until SIGTERM/SIGINT, executing
        no run: `keel dispatcher APP`."""
        await self.open()
        stopping = asyncio.Event()
        with stop_on_signals(stopping.set, enabled=handle_signals):
            await deliver_effects(self.runtime.services, new_worker_id(), stopping)

    async def replay(self, run_id: str, from_step: int | None = None) -> ReplayReport:
        """Re-execute the run's graph in a throwaway copy, effects served from its ledger and
        approvals answered as recorded; report the first step that diverged
        (keel.runtime.replay). Nothing of the run is written, no effect is performed."""
        return await replays.replay(self.runtime, run_id, from_step)

    async def run_worker(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        stop_when_idle: bool = False,
        grace: float = 30.0,
        worker_id: str | None = None,
        handle_signals: bool = True,
        max_clock_skew: float | None = None,
        prune_older_than: str | float | None = None,
        prune_every: str | float = 3600.0,
    ) -> WorkerStats:
        """Execute runs until stopped (SIGTERM/SIGINT: drain; twice: stop now); a worker not
        run at once is `keel.runtime.worker.Worker(app.aio.runtime, ...)`.

        With `prune_older_than` it prunes finished runs older than that at its start and then
        every `prune_every` (a duration: `1h`, `15m`, seconds). ClockSkew if this host's clock
        is more than `max_clock_skew` seconds (default $KEEL_MAX_CLOCK_SKEW, else 300; 0: no
        limit) from the database's."""
        worker = Worker(
            self.runtime,
            concurrency=concurrency,
            stop_when_idle=stop_when_idle,
            grace=grace,
            worker_id=worker_id,
            max_clock_skew=max_clock_skew,
            prune_older_than=prune_older_than,
            prune_interval=prune_every,
        )
        with stop_on_signals(worker.stop, enabled=handle_signals):
            return await worker.run()
