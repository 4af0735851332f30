"""Threads on `keel.AsyncApp`: a conversation's runs, state, history and interrupts.

The rules live in `keel.core.threads` (admission, strategies) and the store (one active run per
thread, in the claim); this is their face in LangGraph's words: `get_state` and `get_history`
return LangGraph's own `StateSnapshot`s, read through the app's saver from the thread's
checkpoints; `keel.runtime.snapshot_json` gives their JSON twin (the HTTP API's and the CLI's).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import StateSnapshot

from keel.core import decisions, threads
from keel.core.errors import (
    CheckpointNotFound,
    DecisionConflict,
    NoPendingWait,
    RunNotFound,
    RunStillGoing,
    ThreadNotFound,
    UsageError,
)
from keel.core.ids import validate_run_id
from keel.core.lifecycle import FINISHED, Status
from keel.core.runs import Admission
from keel.core.store.base import Row
from keel.core.wait_model import RESUMED, WaitStatus, interrupt_kind, is_interrupt_map
from keel.core.workflows import Workflow
from keel.langgraph.graphs import compile_graph
from keel.langgraph.inputs import check_input
from keel.runtime.handoff import Claim, Reserved
from keel.runtime.records import Submission
from keel.runtime.thread_records import ThreadRecords

SETTLED = FINISHED | {Status.WAITING}
"""What `wait` returns at: the run ended, or it waits for an answer (a person may take days)."""


class ThreadOperations(ThreadRecords):
    """The thread operations of `AsyncApp` (mixed into it; `runtime` is the app's): a thread's
    state, its runs and their answers, on its records (`ThreadRecords`)."""

    async def _trace(self, row: Row) -> None: ...  # AsyncApp's

    # -- state ----------------------------------------------------------------------------------

    async def get_state(
        self, thread_id: str, checkpoint_id: str | None = None, *, subgraphs: bool = False
    ) -> StateSnapshot:
        """The thread's state (LangGraph's StateSnapshot: values, next, tasks with their
        interrupts, config, metadata, created_at, parent_config) at its latest checkpoint, or
        at `checkpoint_id`. A run without a thread is read by its run id."""
        graph, config = await self._graph_of(thread_id, checkpoint_id)
        snapshot: StateSnapshot = await graph.aget_state(config, subgraphs=subgraphs)
        if checkpoint_id and snapshot.created_at is None:
            # LangGraph answers an empty state for a checkpoint it has not: say so instead.
            raise CheckpointNotFound(f"thread {thread_id} has no checkpoint {checkpoint_id[:80]!r}")
        return snapshot

    async def get_history(
        self, thread_id: str, limit: int | None = None, before: str | None = None
    ) -> list[StateSnapshot]:
        """The thread's checkpoints as StateSnapshots, newest first (every branch a fork made
        included); `before`: only those older than that checkpoint id."""
        graph, config = await self._graph_of(thread_id, None)
        since = None
        if before:
            thread = config["configurable"]["thread_id"]
            since = {"configurable": {"thread_id": thread, "checkpoint_id": before}}
        return [s async for s in graph.aget_state_history(config, limit=limit, before=since)]

    async def update_state(
        self,
        thread_id: str,
        values: Any,
        as_node: str | None = None,
        *,
        timeout: float | None = 60.0,  # noqa: ASYNC109 - the sync App's callers have no asyncio
    ) -> Row:
        """Write `values` to the thread's state as a new checkpoint, as if node `as_node` wrote
        them (LangGraph's `update_state`). It is a run of its own on the thread: ordered after
        the runs before it, written under its lease like any step, recorded on its timeline
        (who did it: `keel_run_id` in the checkpoint's metadata). Returns that run once it
        ended (its output names the checkpoint); a worker executes it.

        A run paused on a plain `interrupt()` is answered by the update, as in LangGraph, where
        the paused run has already returned: it ends (cancelled, reason `interrupted`, its
        committed steps kept) and the update goes on from its last checkpoint; submit a run
        without input to go on from the update. A run waiting on anything else (a
        `keel.approval`, `keel.sleep`, an in-doubt effect) is never ended by an edit: the
        update queues behind it. Both are decided in the update's admission, under the
        thread's lock (`threads.admit`'s `end_paused`)."""
        thread = await self.get_thread(thread_id)
        wf = self.runtime.workflows.get(thread["workflow"], None)
        nodes = self._compiled(wf).nodes
        if as_node is not None and as_node not in nodes:
            known = ", ".join(n for n in nodes if not n.startswith("__"))
            raise UsageError(f"as_node {as_node!r} is not a node of {wf.key} (its nodes: {known})")
        if values is not None and not isinstance(values, dict):
            # A state of fields takes an object (LangGraph fails the update in the worker);
            # its fields are LangGraph's to judge, as its update_state does.
            check_input(wf, values, partial=True)
        admitted = await threads.admit(
            self.runtime.store,
            workflow=wf.name,
            version=wf.version,
            thread_id=thread_id,
            create=False,
            input=None,
            command={"update_state": {"values": values, "as_node": as_node}},
            checkpoint_id=None,
            config=None,
            strategy="enqueue",
            thread_metadata=None,
            job_id=None,
            max_input_bytes=self.runtime.max_input_bytes,
            end_paused=True,
        )
        self.runtime.wake()
        return await self.wait(str(admitted.row["run_id"]), timeout=timeout)

    # -- runs on threads ------------------------------------------------------------------------

    async def _submit_on_thread(
        self,
        wf: Workflow,
        input: Any,
        *,
        thread_id: str | None,
        command: dict[str, Any] | None,
        config: dict[str, Any],
        checkpoint_id: str | None,
        strategy: str,
        metadata: dict[str, Any] | None,
        job_id: str | None,
        delay: float | None = None,
        not_before: float | None = None,
        merge_metadata: dict[str, Any] | None = None,
        end_paused: bool = False,
        create: bool = True,
    ) -> Submission:
        if checkpoint_id is not None and thread_id is None:
            raise UsageError("checkpoint_id names a checkpoint of a thread: give thread_id")
        if merge_metadata is not None and not isinstance(merge_metadata, dict):
            raise UsageError("merge_metadata must be an object")
        # A worker of this process with a free slot claims in the admission's commit (the
        # oldest claimable run, thread order kept: keel.runtime.handoff); not for a delayed run.
        later = delay is not None or not_before is not None
        taker, claim = (None, None) if later else self.runtime.taker()
        slot = Reserved(taker) if taker is not None else None
        try:
            admitted = await self._admit_on_thread(
                wf,
                input,
                thread_id=thread_id,
                command=command,
                config=config,
                checkpoint_id=checkpoint_id,
                strategy=strategy,
                metadata=metadata,
                job_id=job_id,
                delay=delay,
                not_before=not_before,
                merge_metadata=merge_metadata,
                then=claim,
                end_paused=end_paused,
                create=create,
            )
            if admitted.created:
                await self._trace(admitted.row)  # before the worker it goes to can start it
            if slot is not None and admitted.created:
                await slot.adopt(admitted.then)
        finally:
            if slot is not None:
                slot.give_back()
        handed = admitted.then is not None and admitted.then["run_id"] == admitted.row["run_id"]
        if admitted.created and not handed:
            self.runtime.wake()
        return Submission(admitted.row, created=admitted.created)

    async def _admit_on_thread(
        self,
        wf: Workflow,
        input: Any,
        *,
        thread_id: str | None,
        command: dict[str, Any] | None,
        config: dict[str, Any],
        checkpoint_id: str | None,
        strategy: str,
        metadata: dict[str, Any] | None,
        job_id: str | None,
        delay: float | None,
        not_before: float | None,
        merge_metadata: dict[str, Any] | None,
        then: Claim | None,
        end_paused: bool,
        create: bool,
    ) -> Admission:
        if checkpoint_id and thread_id:
            # A fork from a checkpoint the thread does not have started from an empty state,
            # and that became the thread's latest: the conversation reset.
            where = {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
            if await self.runtime.fencing().aget_tuple({"configurable": where}) is None:
                raise CheckpointNotFound(
                    f"thread {thread_id} has no checkpoint {checkpoint_id[:80]!r} to fork from"
                )
        return await threads.admit(
            self.runtime.store,
            workflow=wf.name,
            version=wf.version,
            thread_id=thread_id or threads.new_id(),
            create=create,
            input=input,
            command=command,
            checkpoint_id=checkpoint_id,
            config=config,
            strategy=strategy,
            thread_metadata=metadata,
            job_id=job_id,
            max_input_bytes=self.runtime.max_input_bytes,
            check=None if command else functools.partial(check_input, wf, partial=True),
            delay=delay,
            not_before=not_before,
            merge_metadata=merge_metadata,
            then=then,
            end_paused=end_paused,
        )

    async def wait(
        self,
        run_id: str,
        timeout: float | None = None,  # noqa: ASYNC109 - the sync App's callers have no asyncio
    ) -> Row:
        """The run's row once it has ended, or waits for an answer (a person, a deadline);
        RunStillGoing (a TimeoutError naming the run) past `timeout` seconds (None: no
        limit)."""
        await self.open()
        validate_run_id(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.01
        while True:
            row = await self.runtime.store.get_run(run_id)
            if row is None:
                raise RunNotFound(f"no run {run_id!r}")
            if row["status"] in SETTLED:
                return row
            if deadline is not None and time.monotonic() >= deadline:
                raise RunStillGoing(
                    f"run {run_id} is still {row['status']} after {timeout} s",
                    run_id=run_id,
                    status=str(row["status"]),
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    async def resume_thread(
        self,
        thread_id: str,
        value: Any,
        *,
        wait_id: str | None = None,
        by: str | None = None,
        principal: str | None = None,
        comment: str | None = None,
        action_id: str | None = None,
        channel: str = "api",
    ) -> decisions.DecisionResult:
        """Answer the interrupt the thread's active run waits on with `value` (what
        `interrupt()` returns): LangGraph's `Command(resume=value)`; a value keyed by interrupt
        ids (`{interrupt_id: value}`, as LangGraph reads one) answers each. The first answer wins;
        a later one is told what was recorded (`recorded` False). `by` is who the caller says
        answered, `principal` the identity that made the call (recorded for the audit)."""
        await self.open()
        threads.validate_thread_id(thread_id)
        run_id = str((await self._waiting_run(thread_id))["run_id"])
        answers: list[tuple[str | None, Any]] = [(wait_id, value)]
        if wait_id is None and is_interrupt_map(value):
            answers = await self._each_answer(thread_id, run_id, value, action_id)
        results = [
            await decisions.decide(
                self.runtime.services,
                run_id,
                decision=RESUMED,
                wait_id=target,
                value={"resume": answer},
                by=by,
                principal=principal,
                comment=comment,
                action_id=action_id,
                channel=channel,
            )
            for target, answer in answers
        ]
        # An answer another won is what the caller must hear of (DecisionConflict in `resume`).
        return next((r for r in results if not r.recorded), results[-1])

    async def _each_answer(
        self, thread_id: str, run_id: str, value: dict[str, Any], action_id: str | None
    ) -> list[tuple[str | None, Any]]:
        """The waits a resume keyed by interrupt ids answers, each with its value: every one
        checked before any is decided (LangGraph applies the map as one command), so a map
        one of whose answers cannot be taken records none."""
        found = {w["interrupt_id"]: w for w in await self.runtime.store.waits(run_id)}
        if strange := sorted(set(value) - set(found)):
            raise NoPendingWait(
                f"thread {thread_id}: its run {run_id} has no interrupt "
                f"{', '.join(strange)} (answer the ids its interrupts carry)"
            )
        for interrupt_id in value:
            wait = found[interrupt_id]
            decisions.check_answer(wait["kind"], RESUMED, wait_id=wait["wait_id"])
            retried = action_id is not None and wait["action_id"] == action_id
            if wait["status"] != WaitStatus.PENDING and not retried:
                raise DecisionConflict(
                    f"wait {wait['wait_id']} (interrupt {interrupt_id}) was already "
                    f"{wait['status']}: none of this resume's answers was recorded"
                )
        return [(str(found[iid]["wait_id"]), v) for iid, v in value.items()]

    async def paused_without_run(self, thread_id: str) -> bool:
        """Whether the thread stands paused on an interrupt LangGraph knows (a plain
        `interrupt()` or `keel.interrupt()`: `threads.PAUSED_KINDS`) that no run answers any
        more: a state update ended the run paused there (its latest runs: the paused one,
        ended `interrupted`, then the update, completed), or it is a copy of a thread paused
        so (no run of its own yet). A `resume` of it is then a new run from that checkpoint,
        as LangGraph resumes a checkpoint rather than a run.

        Nothing else is: a failed or cancelled run's checkpoint (a new run would perform its
        node's effects again, where resuming the run serves them), nor any other Keel wait (an
        approval's approvers and deadline, a timer, a person's word on an effect are answered
        through the wait, never by whoever writes to the thread)."""
        await self.open()
        threads.validate_thread_id(thread_id)
        store = self.runtime.store
        thread = await store.get_thread(thread_id)
        if thread is None or not thread.get("workflow"):
            return False  # no graph yet (a thread made through the Agent Server, no run)
        if await store.thread_active_run(thread_id) is not None:
            return False
        latest = await store.thread_runs(thread_id, 2, newest=True)
        if latest and not threads.updated_after_pause(latest):
            return False
        snapshot = await self.get_state(thread_id)
        if not snapshot.next:
            return False
        interrupts = [i.value for task in snapshot.tasks for i in task.interrupts]
        if not latest and not interrupts:
            return False  # a copy of a thread that is not paused (a failed one's checkpoint)
        # The rule a state update ends a paused run by (`_end_paused`), on the waits the
        # checkpoint would register: a copy has no wait rows to read.
        return threads.PAUSED_KINDS.issuperset(interrupt_kind(v) for v in interrupts)

    async def _waiting_run(self, thread_id: str) -> Row:
        store = self.runtime.store
        if await store.get_thread(thread_id) is None:
            row = await store.get_run(thread_id)  # a run of its own thread
            if row is None or row.get("thread_id"):
                raise ThreadNotFound(f"no thread {thread_id!r}")
            return row
        active = await store.thread_active_run(thread_id)
        if active is None:
            raise NoPendingWait(f"thread {thread_id} has no run waiting for input")
        return active

    async def _graph_of(
        self, thread_id: str, checkpoint_id: str | None
    ) -> tuple[Any, RunnableConfig]:
        """The compiled graph of the thread's workflow (the version of its latest run), and the
        config that reads the thread (at `checkpoint_id`)."""
        await self.open()
        threads.validate_thread_id(thread_id)
        store = self.runtime.store
        thread = await store.get_thread(thread_id)
        if thread is not None:
            name, version = thread["workflow"], thread["latest_version"]
        else:
            run = await store.get_run(thread_id)
            if run is None or run.get("thread_id"):
                raise ThreadNotFound(f"no thread {thread_id!r}")
            name, version = run["workflow"], run["workflow_version"]
        workflow = self.runtime.workflows.get(name, version)
        configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
        if checkpoint_id:
            configurable["checkpoint_id"] = checkpoint_id
        return self._compiled(workflow), {"configurable": configurable}

    def _compiled(self, workflow: Workflow) -> Any:
        cache: dict[str, Any] = self.__dict__.setdefault("_thread_graphs", {})
        if workflow.key not in cache:
            runtime = self.runtime
            cache[workflow.key] = compile_graph(
                workflow, runtime.fencing(), runtime.langgraph_store
            )
        return cache[workflow.key]
