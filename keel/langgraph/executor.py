"""The one execution seam: run or resume one claimed run under its lease.

Every path (first execution, crash recovery, resume after a decision) comes here: the executor
decides the graph's input from what is durable — the admitted input when nothing was
checkpointed, LangGraph's resume map for decided waits, or None to continue from the last
checkpoint — then records the outcome (waiting, completed, failed) fenced by the lease.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.store.base import BaseStore
from langgraph.types import Command, Send, interrupt

from keel.core import attempts, failures, leases, logs, threads, waits
from keel.core.codec import dumps, loads
from keel.core.context import RunContext, enter, leave
from keel.core.errors import LeaseLost, Released, RunCancelled
from keel.core.faults import fault_point
from keel.core.leases import LeaseEnd
from keel.core.lifecycle import Status, TerminationReason
from keel.core.runs import finish
from keel.core.services import Services
from keel.core.store.base import Row
from keel.core.store.store import Lease
from keel.core.tracing import NO_TRACER
from keel.core.workflows import Workflow, Workflows
from keel.langgraph import chunks, outcomes, retries, static_interrupts, tool_calls, traces
from keel.langgraph.graphs import compile_graph, locate, plain_start
from keel.langgraph.invocation import invocation_config
from keel.langgraph.savers import FencedSaver
from keel.langgraph.successor import Successor, then_claim

log = logging.getLogger("keel.executor")
retries.install()  # a RetryPolicy's retry finds its first attempt's subgraph effects
tool_calls.install()  # a ToolNode's parallel calls number their effects each in its own call

_compiled: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
"""Per fenced saver, its workflows' compiled graphs (a graph is compiled with its saver)."""


@dataclass(frozen=True)
class StateUpdate:
    """A run that only updates its thread's state (`AsyncApp.update_state`)."""

    values: Any
    as_node: str | None
    written: dict[str, Any] | None = None
    """The checkpoint's config when an earlier execution of the run already wrote it."""


Outcome = Status | LeaseEnd
"""What `Executor.execute` returns: the status the run reached, or why this worker let go."""


class Executor:
    """Executes claimed runs of the registered workflows with the fenced saver."""

    def __init__(
        self,
        services: Services,
        workflows: Workflows,
        saver: FencedSaver,
        worker_id: str,
        *,
        store: BaseStore | None = None,
    ) -> None:
        self.services = services
        self.workflows = workflows
        self.saver = saver
        self.store = store
        """The LangGraph store the nodes get (keel.langgraph.stores), one per saver."""
        self.worker_id = worker_id
        # Shared by every executor on this saver: a worker started later (a drain, a restart
        # of the loop's worker) does not compile each graph again on the loop (~5 ms each).
        self._graphs = _compiled.setdefault(saver, {})
        self.successor: Successor | None = None
        """Set by a worker: a run's end may claim the next run in its own last transaction."""

    def graph(self, workflow: Workflow) -> Any:
        key = workflow.key
        if key not in self._graphs:
            self._graphs[key] = compile_graph(workflow, self.saver, self.store)
        return self._graphs[key]

    async def execute(self, lease: Lease, run: Row) -> Outcome:
        """Execute until the run finishes or waits; return the status it reached.

        Only the graph's own failures end the run failed at once. An infrastructure fault gives
        the run back to resume from its last checkpoint; a crash outside the graph's nodes is
        retried after a backoff; either ends the run failed past its limit (`Attempts`).
        """
        # Every line logged inside (Keel's, LangGraph's, the nodes') carries these ids.
        with logs.bind(
            run_id=lease.run_id,
            job_id=run["job_id"],
            workflow=f"{run['workflow']}@{run['workflow_version']}",
            worker_id=self.worker_id,
            token=lease.token,
            locate=locate,
            marks={},
            started=time.monotonic(),
        ):
            tracer = traces.active()
            if tracer is None:
                return await self._attempt(lease, run, None)
            return await self._traced(tracer, lease, run)

    async def _traced(self, tracer: traces.RunTracer, lease: Lease, run: Row) -> Outcome:
        """The attempt as a span of the run's trace (keel.langgraph.traces)."""
        try:
            parent = await tracer.root(self.services.store, run, by=self.worker_id)
        except Exception as exc:  # the database is away: the attempt meets it and says so
            log.debug("run %s: no trace context (%r)", lease.run_id, exc)
            parent = None
        span = tracer.attempt(parent, run, self.worker_id, lease.token)
        steps = tracer.steps(span)
        try:
            with traces.current(span):
                outcome = await self._attempt(lease, run, steps)
        except BaseException as exc:
            steps.close()
            traces.end_attempt(span, "interrupted", exc)
            raise
        steps.close()
        traces.end_attempt(span, str(outcome.value))
        return outcome

    async def _attempt(self, lease: Lease, run: Row, steps: traces.Steps | None) -> Outcome:
        held = (lease.run_id, lease.token)
        try:
            return await self._execute(lease, run, steps)
        except Exception as exc:
            # Outside the graph's own code (its failures end the run in `_execute`): the
            # core's failure policy counts the attempt and says what comes next.
            progressed = held in self.saver.progressed
            return await attempts.failed(self.services, lease, exc, progressed=progressed)
        finally:
            self.saver.progressed.discard(held)

    async def _execute(self, lease: Lease, run: Row, steps: traces.Steps | None) -> Outcome:
        rt = self.services
        workflow = self.workflows.get(run["workflow"], run["workflow_version"])
        graph = self.graph(workflow)
        thread = run.get("thread_id")
        submitted = threads.run_config(run)
        config = invocation_config(
            run, submitted, graph, workflow, run_id=lease.run_id, worker_id=self.worker_id
        )
        if steps is not None:
            config["callbacks"] = [steps]
        ctx = RunContext(
            run_id=lease.run_id,
            job_id=run["job_id"],
            workflow=workflow.name,
            token=lease.token,
            worker_id=self.worker_id,
            services=rt,
            locate=locate,
            pause=interrupt,
            last_heartbeat=loads(run.get("heartbeat_details")),
            tracer=steps if steps is not None else NO_TRACER,
            settle=functools.partial(self.saver.settle, lease.run_id, lease.token),
            thread_id=thread or "",
            effect_keys=int(run.get("effect_keys") or 1),
        )
        # A run on a thread of many runs reads the thread's checkpoints even on its first claim.
        never_ran = bool(run.get("first_claim")) and thread is None
        self.saver.hold(
            lease.run_id,
            lease.token,
            self.worker_id,
            never_ran=never_ran,
            first_claim=bool(run.get("first_claim")),
            plain_start=plain_start(graph),
            triggers=getattr(graph, "trigger_to_nodes", None),
            thread_id=thread,
        )
        entered = enter(ctx)
        try:
            if run.get("cancel_requested"):
                # Taken over after a crash with a cancel already asked: it stops at this
                # boundary rather than start a step (or write a thread's input checkpoint).
                raise RunCancelled(f"run {lease.run_id} was cancelled")
            graph_input = await self._input(graph, config, run, workflow, lease)
            if isinstance(graph_input, StateUpdate):
                return await self._update_state(ctx, graph, config, graph_input)
            context = submitted.get("context")
            extra = {"context": context} if context is not None else {}
            static = static_interrupts.invoke_options(submitted)
            extra.update(static)
            # The run's own options win over the compiled graph's, as in LangGraph.
            pauses = static or static_interrupts.compiled_with(graph)
            capture = chunks.capture_for(rt.store, self.saver, lease.run_id, lease.token, submitted)
            if capture is not None:  # a client streams modes only the live graph produces
                await capture.begin(graph_input, first=bool(run.get("first_claim")))
            try:
                if capture is not None:
                    output = await capture.run(
                        graph, graph_input, config, durability=workflow.durability, **extra
                    )
                else:
                    output = await graph.ainvoke(
                        graph_input, config, durability=workflow.durability, **extra
                    )
            except (LeaseLost, RunCancelled, Released):
                raise
            except Exception as exc:
                if rt.store.is_keel_fault(exc):
                    raise
                # The graph's own failure (a node raised, a recursion limit, a node's own
                # database failing): final.
                log.exception(
                    "worker %s run %s (token %s) failed", self.worker_id, lease.run_id, lease.token
                )
                where = await outcomes.failed_task(graph, config, exc)
                return await self._end(
                    ctx,
                    Status.FAILED,
                    TerminationReason.EXECUTION_ERROR,
                    f"{type(exc).__name__}: {exc}",
                    failure=failures.describe(exc, where),
                )
            # A clean end: every task write committed with a checkpoint or at once.
            await self.saver.finish(lease.run_id, lease.token)
            interrupts, values = await outcomes.interrupts_and_values(graph, config, output)
            if pauses and not interrupts:  # a static pause returns no `__interrupt__`
                interrupts = await static_interrupts.paused(graph, config, pauses)
            if ctx.staged:
                # The graph ended, yet a task's intents found no write to commit with.
                log.warning(
                    "run %s: outbox intents of tasks %s were not recorded: their steps wrote "
                    "nothing durable (durability=%r, or a node that returned no update)",
                    lease.run_id,
                    ", ".join(ctx.staged),
                    workflow.durability,
                )
            if interrupts:
                # The pause's writes and the checkpoints held back commit with its waits.
                within = self.saver.ending(lease.run_id, lease.token, pause=True)
                fault_point("wait.after_interrupt", workflow.name)
                return await waits.register(ctx, interrupts, within=within)
            return await self._complete(ctx, workflow, values, never_ran=never_ran)
        except LeaseLost as exc:
            log.warning(
                "worker %s run %s: lease lost (token %s): %s",
                self.worker_id,
                lease.run_id,
                lease.token,
                exc,
            )
            return LeaseEnd.LOST
        except RunCancelled:
            ended = await self._end(ctx, Status.CANCELLED, TerminationReason.CANCELLED, None)
            if thread and ended == Status.CANCELLED:
                await threads.after_stop(rt.store, lease.run_id, thread)
            return ended
        except Released:
            await leases.release(rt.store, lease, "worker stopping")
            return LeaseEnd.RELEASED
        finally:
            leave(entered)
            # What this execution buffered or staged and did not commit is dropped: the run
            # resumes from its last checkpoint, and its nodes stage their rows again.
            self.saver.drop(lease.run_id, lease.token)
            ctx.staged.clear()

    async def _input(
        self, graph: Any, config: dict[str, Any], run: Row, workflow: Workflow, lease: Lease
    ) -> Any:
        """What to invoke the graph with, from at most one read of the run's checkpoint: none
        for a run claimed for the first time (it never ran, so nothing was checkpointed)."""
        started = time.monotonic()
        if run.get("thread_id"):
            return await self._thread_input(config, run, workflow, lease, started)
        first = bool(run.get("first_claim"))
        saved = None if first else await self.saver.aget_tuple(cast(RunnableConfig, config))
        if saved is None:
            # Admitted, never checkpointed (perhaps a crash right after the claim): start from
            # the admitted input; LangGraph alone would raise EmptyInputError on invoke(None).
            fault_point("run.before_first_checkpoint", workflow.name)
            _resumed(run, "from its admitted input (no checkpoint yet)", started, "run.start")
            return loads(run["input"])
        return await self._continue(config, run, saved, started)

    async def _continue(
        self, config: dict[str, Any], run: Row, saved: Any, started: float
    ) -> Command | None:
        """The input that continues the run from its own latest checkpoint `saved`: the
        answers of its decided waits, or nothing."""
        # LangGraph's loop reads the same checkpoint as it starts: it gets this read.
        self.saver.read_ahead(str(config["configurable"]["thread_id"]), saved)
        pending = outcomes.pending_interrupts(saved.pending_writes or ())
        if pending:
            answered = await waits.claimed_answers(self.services.store, run)
            resume = waits.resume_map(answered, pending)
            if resume:
                _resumed(run, f"with {len(resume)} decided wait(s)", started)
                return Command(resume=resume)
        _resumed(run, "from its last checkpoint", started)
        return None

    async def _thread_input(
        self, config: dict[str, Any], run: Row, workflow: Workflow, lease: Lease, started: float
    ) -> Any:
        """A run on a thread of many runs: it continues from its own latest checkpoint if the
        thread's latest is one it wrote; else it starts (from its input, its command, or a
        state update) on the thread's latest checkpoint, or on the past one it forks from."""
        if run.get("after_rollback", True):
            # What rolled-back runs of the thread wrote goes before anything reads the thread
            # (fenced: only while this run holds it). Whichever run comes next does it, not
            # only the one that asked for the rollback: that one may have been cancelled
            # before it ran. Idempotent: a restart of this run discards nothing more.
            async with self.services.store.fenced(lease.run_id, lease.token) as tx:
                await self.services.store.discard_rolled_back(tx, str(run["thread_id"]))
        saved = await self.saver.aget_tuple(cast(RunnableConfig, config))
        thread = str(run["thread_id"])
        how, value = threads.graph_start(run)
        if saved is not None and saved.metadata.get("keel_run_id", thread) == run["run_id"]:
            if how == "update_state":  # written before a crash: only its end is left
                return StateUpdate(None, value.get("as_node"), written=dict(saved.config))
            return await self._continue(config, run, saved, started)
        if saved is not None and not run.get("first_claim") and not run.get("checkpoint_id"):
            # Paused where it began, on another run's checkpoint, before writing one of its own
            # (no input on a paused thread, a goto whose node asks): answered since, it resumes
            # there with its answers. Started again instead, it asked again, found its wait
            # decided and was queued again, for ever.
            pending = outcomes.pending_interrupts(saved.pending_writes or ())
            answered = await waits.claimed_answers(self.services.store, run) if pending else []
            resume = waits.resume_map(answered, pending) if answered else None
            if resume:
                self.saver.read_ahead(thread, saved)
                _resumed(run, f"with {len(resume)} decided wait(s)", started)
                return Command(resume=resume)
        if run.get("checkpoint_id"):
            config["configurable"]["checkpoint_id"] = run["checkpoint_id"]
        elif saved is not None:
            # The turn starts on the checkpoint just read: LangGraph's loop gets this read.
            self.saver.read_ahead(thread, saved)
        fault_point("run.before_first_checkpoint", workflow.name)
        _resumed(run, f"on thread {thread} from its {how}", started, "run.start")
        if how == "update_state":
            return StateUpdate(value.get("values"), value.get("as_node"))
        if how == "command" and "resume" in value:  # a pause no run waits on any more
            return Command(resume=value["resume"])
        if how == "command":
            return Command(update=value.get("update"), goto=_goto(value.get("goto") or ()))
        return value

    async def _update_state(
        self, ctx: RunContext, graph: Any, config: dict[str, Any], update: StateUpdate
    ) -> Outcome:
        """A state update as a run of its own on the thread: one checkpoint, written under the
        run's lease like any step's, recorded as the run's output."""
        written = update.written
        if written is None:
            try:
                written = await graph.aupdate_state(config, update.values, as_node=update.as_node)
            except (LeaseLost, RunCancelled, Released):
                raise
            except Exception as exc:
                if self.services.store.is_keel_fault(exc):
                    raise
                # The update itself is wrong (a value the state refuses): final, as a node's
                # error is, not a crash to retry.
                return await self._end(
                    ctx,
                    Status.FAILED,
                    TerminationReason.EXECUTION_ERROR,
                    f"{type(exc).__name__}: {exc}",
                    failure=failures.describe(exc, {"node": update.as_node or ""}),
                )
            await self.saver.finish(ctx.run_id, ctx.token)
        checkpoint = written.get("configurable", {}).get("checkpoint_id")
        return await self._end(
            ctx,
            Status.COMPLETED,
            TerminationReason.COMPLETED,
            None,
            output=dumps({"checkpoint_id": checkpoint, "as_node": update.as_node}),
        )

    async def _complete(
        self, ctx: RunContext, workflow: Workflow, values: Any, *, never_ran: bool
    ) -> Outcome:
        try:
            given = workflow.termination(values) if workflow.termination else None
            reason = None if given is None else TerminationReason(given)
        except Exception:
            # The user's hook failed: the last step is done and stays done (its checkpoint
            # commits now, as at any boundary); only the end is retried.
            await self.saver.settle(ctx.run_id, ctx.token)
            raise
        if reason is None and never_ran:
            # Its first execution ran to the end: it never waited, so no decision or deadline
            # can be why it ended (a wait would have ended the execution).
            reason = TerminationReason.COMPLETED
        # Else (None) the end's own statement judges it from the run's waits: no read first.
        return await self._end(
            ctx,
            Status.COMPLETED,
            reason,
            None,
            output=outcomes.encoded_output(values),
        )

    async def _end(
        self,
        ctx: RunContext,
        status: Status,
        reason: TerminationReason | None,
        error: str | None,
        output: str | None = None,
        failure: dict[str, Any] | None = None,
    ) -> Outcome:
        """The execution's end, in one fenced statement (its event with it), committed with the
        last step's checkpoint when that waits for it (`Fencing.ending`)."""
        within = self.saver.ending(ctx.run_id, ctx.token)
        if within is not None and self.successor is not None:
            within = then_claim(within, self.successor)
        try:
            await finish(
                self.services.store,
                ctx.run_id,
                ctx.token,
                status,
                worker_id=ctx.worker_id,
                termination_reason=None if reason is None else reason.value,
                error=error,
                output=output,
                within=within,
                failure=failure,
            )
        except LeaseLost as exc:
            log.warning(
                "worker %s run %s: lease %s lost before it could end: %s",
                ctx.worker_id,
                ctx.run_id,
                ctx.token,
                exc,
            )
            return LeaseEnd.LOST
        return status


def _goto(goto: Any) -> Any:
    """A command's `goto` as LangGraph takes it: the protocol's `{"node", "input"}` objects (how
    its SDKs write a `Send`) as Sends; node names as they are."""
    if isinstance(goto, list):
        return [_goto(target) for target in goto]
    if isinstance(goto, dict):
        return Send(goto["node"], goto.get("input"))
    return goto


def _resumed(run: Row, how: str, started: float, kind: str = "run.resume") -> None:
    """One line saying where the run goes on from, with the time reading its state took."""
    took = round(time.monotonic() - started, 6)
    log.info("%s %s", kind, how, extra={"event": kind, "run_id": run["run_id"], "duration": took})
