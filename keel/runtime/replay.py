"""Replay: re-execute a run's graph in a throwaway copy and name the first step that diverged.

The graph (the workflow at the run's version, from this App's registry) runs on the run's own
thread id — effect keys are made of it — but in LangGraph's in-memory saver, seeded with the
recorded checkpoint before the first replayed step. Nothing of the run is written: no
checkpoint, ledger row, wait, event or artifact (artifacts go to a temporary folder that is
removed). Every effect is answered from the recorded ledger and never performed; an effect key
the run does not have stops the replay there and is reported, the provider is not called.
Approvals are answered with the decisions the run's waits recorded.

The replayed steps are then compared with the recorded ones, step by step (the step numbers
are LangGraph's, as in the ledger: the input is step 0): the effects called (keys and argument
hashes), each task's writes and errors, the tasks per node, and the route (the nodes that run
next). The first step with a difference is the report's `step` (keel.runtime.replay_steps).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from keel.core.artifacts import RunArtifacts
from keel.core.codec import loads
from keel.core.context import RunContext, enter, leave
from keel.core.effects.keys import Identity, effect_key
from keel.core.effects.ledger import SETTLED, changed_arguments, recorded_result
from keel.core.errors import KeelError, RunNotFound, UsageError
from keel.core.ids import StepRef, validate_run_id
from keel.core.store.base import Row
from keel.core.threads import run_config
from keel.core.wait_model import WaitKind, WaitStatus, keel_wait
from keel.core.waits import resume_value
from keel.langgraph import tool_calls
from keel.langgraph.graphs import compile_graph, locate, recursion_limit
from keel.runtime.replay_steps import (
    Difference,
    Halt,
    ReplayReport,
    Step,
    What,
    judge,
    last,
    read_steps,
    relocate,
)

if TYPE_CHECKING:
    from keel.runtime.runtime import Runtime

__all__ = ["Difference", "ReplayReport", "replay"]

tool_calls.install()  # a replayed ToolNode names its calls as the run did (their effect keys)

MAX_RESUMES = 10_000


ANSWERED_AS_RECORDED = (WaitKind.APPROVAL, WaitKind.OUTBOX)
"""The waits a replay answers with their recorded value: approvals, outbox deliveries."""


class _Stop(KeelError):
    """Ends a replay inside a node: it cannot go on like the recorded run (or need not)."""

    def __init__(self, halt: Halt) -> None:
        detail = halt.difference.detail if halt.difference else "replay stopped"
        super().__init__(halt.note or detail)
        self.halt = halt


class _Answers:
    """The replay's effects and approvals, answered from what the run recorded."""

    def __init__(
        self,
        effects: list[Row],
        waits: list[Row],
        recorded: dict[int, Step],
        root_step: Callable[[], int],
        root_tasks: Callable[[], dict[str, str]],
    ) -> None:
        self.effects = {str(e["idempotency_key"]): e for e in effects}
        self.waits = {str(w["interrupt_id"]): w for w in waits}
        self.recorded = recorded
        self.root_step = root_step
        """The root graph's step running now (a subgraph's StepRef counts its own steps)."""
        self.root_tasks = root_tasks
        """Task path -> task id of the root graph's tasks running now."""
        self.calls: list[str] = []
        self.answered: set[str] = set()
        """The recorded waits the replay got its answers from (by interrupt id)."""
        self.ctx: RunContext | None = None
        self.stop: Halt | None = None
        """The first stop, kept here too: a node that catches every exception cannot hide it."""

    def _differs(
        self, where: StepRef, what: What, detail: str, *, recorded: Any = None, replayed: Any = None
    ) -> _Stop:
        """Stop at `where`, where the replay did `what` otherwise than the recorded run."""
        found = Difference(
            what=what, node=where.node, recorded=recorded, replayed=replayed, detail=detail
        )
        return self._stop(where, found)

    def _stop(self, where: StepRef, difference: Difference | None, note: str = "") -> _Stop:
        halt = Halt(where.step if not where.namespace else self.root_step(), difference, note)
        self.stop = self.stop or halt
        return _Stop(halt)

    def effect(
        self,
        name: str,
        key: str,
        legacy_key: str,
        where: StepRef,
        index: int,
        identity: Identity,
        tool: str | None = None,
    ) -> Any:
        legacy = self.effects.get(legacy_key)
        row = legacy if legacy is not None and legacy["arg_hashes"] is None else None
        if row is None and where.namespace and key not in self.effects:
            key = effect_key(self._as_recorded(where), name, index, tool)
        row = row or self.effects.get(key)
        if row is None:
            raise self._differs(
                where,
                "effect_key",
                f"effect {name!r} under key {key}, which the run never had (not performed)",
                replayed={"effect": name, "key": key},
            )
        self.calls.append(str(row["idempotency_key"]))
        changed = changed_arguments(row, identity)
        if changed:
            raise self._differs(
                where,
                "effect_arguments",
                f"effect {name!r} called with other arguments: {', '.join(changed)}",
                recorded={"effect": row["name"], "key": key, "args_hash": row["args_hash"]},
                replayed={"effect": name, "key": key, "args_hash": identity.digest},
            )
        if row["status"] not in SETTLED:
            # Not a change of the graph: the run itself never learnt what happened here.
            raise self._stop(
                where,
                None,
                f"stopped at effect {name!r} ({key}): it is {row['status']} in the ledger, "
                "the run never learnt its result",
            )
        return recorded_result(row)

    def _as_recorded(self, where: StepRef) -> StepRef:
        """A call inside a subgraph as the recorded run made it: its key holds the id of the
        root task that runs the subgraph, made from the id of the checkpoint before it, and
        the replay's checkpoints have new ids. The recorded task at the same path has the
        recorded id. (Deeper subgraphs' own task ids are not mapped.)"""
        step = self.recorded.get(self.root_step())
        recorded = step.ids if step else {}
        ids = {i: recorded[path] for path, i in self.root_tasks().items() if path in recorded}
        head, sep, rest = where.namespace.partition("|")
        node, colon, task = head.partition(":")
        return dataclasses.replace(
            where, namespace=f"{node}{colon}{ids.get(task, task)}{sep}{rest}"
        )

    def pause(self, spec: Any) -> Any:
        """A wait in the replay: answered with the recorded decision of the same wait."""
        assert self.ctx is not None
        where = locate()
        described = keel_wait(spec)
        name = described.get("name") if described is not None else None
        wait = self._recorded_wait(where, name)
        if wait is not None and wait["status"] == WaitStatus.PENDING:
            raise self._stop(
                where, None, f"reached the wait {wait['wait_id']} the run is waiting on"
            )
        if wait is None:
            raise self._differs(
                where,
                "approval",
                f"a wait {name!r} the run never had at this place",
                replayed={"wait": name},
            )
        self.answered.add(str(wait["interrupt_id"]))
        return loads(wait["value"])

    def _recorded_wait(self, where: StepRef, name: str | None) -> Row | None:
        """The recorded wait at this pause's place: the same task's n-th wait; inside a
        subgraph (whose task paths the root checkpoints do not show), the first not yet
        answered wait of the same name in the same root step."""
        assert self.ctx is not None
        if not where.namespace:
            step = self.recorded.get(where.step)
            ids = [i for i in (step.interrupts.get(where.path, []) if step else [])]
            # An outbox wait (keel.await_effect) is answered as recorded too: its delivery.
            ids = [i for i in ids if self._kind(i) in (*ANSWERED_AS_RECORDED, None)]
            index = self.ctx.calls.next(where, "\0wait")
            return self.waits.get(ids[index]) if index < len(ids) else None
        step = self.recorded.get(self.root_step())
        for ids in step.interrupts.values() if step else []:
            for i in ids:
                wait = self.waits.get(i)
                if wait is None or i in self.answered or wait["kind"] not in ANSWERED_AS_RECORDED:
                    continue
                if wait["name"] == name:
                    return wait
        return None

    def _kind(self, interrupt_id: str) -> str | None:
        wait = self.waits.get(interrupt_id)
        return None if wait is None else str(wait["kind"])

    def plain(self, state: Any) -> dict[str, Any] | None:
        """LangGraph's resume map for the plain `interrupt()`s the replay paused on, from the
        recorded waits of the same tasks; None (and a stop) where the run has no answer."""
        number = int(state.metadata.get("step", -1)) + 1
        step = self.recorded.get(number)
        resume: dict[str, Any] = {}
        for task in state.tasks:
            path = "/".join(map(str, task.path))
            ids = [
                i
                for i in (step.interrupts.get(path, []) if step else [])
                if self._kind(i) == WaitKind.INTERRUPT
            ]
            for n, pending in enumerate(task.interrupts):
                wait = self.waits.get(ids[n]) if n < len(ids) else None
                if wait is None or wait["status"] == WaitStatus.PENDING:
                    self.stop = self.stop or Halt(
                        number,
                        None
                        if wait is not None
                        else Difference(
                            what="approval",
                            node=task.name,
                            replayed={"interrupt": pending.value},
                            detail="a plain interrupt() the run never had at this place",
                        ),
                        f"reached the wait {wait['wait_id']} the run is waiting on"
                        if wait is not None
                        else "",
                    )
                    return None
                resume[pending.id] = resume_value(loads(wait["value"]))
                self.answered.add(ids[n])
        return resume


async def replay(rt: Runtime, run_id: str, from_step: int | None = None) -> ReplayReport:
    """Replay `run_id` from `from_step` (default: its first step) and report the divergence."""
    await rt.open()
    validate_run_id(run_id)
    run = await rt.store.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    if run.get("thread_id"):
        # Its checkpoints are interleaved with its thread's other runs' (docs/threads.md).
        raise UsageError(
            f"run {run_id} is a turn of thread {run['thread_id']}: replay reads a run's own "
            "thread, and runs on threads of many runs cannot be replayed yet"
        )
    workflow = rt.workflows.get(run["workflow"], run["workflow_version"])
    saver = rt.fencing()
    recorded_history, recorded = await read_steps(
        compile_graph(workflow, saver), saver, run_id, own_graph=False
    )
    report = ReplayReport(
        run_id=run_id,
        workflow=workflow.name,
        version=workflow.version,
        status=str(run["status"]),
        from_step=from_step if from_step is not None else 0,
    )
    if not recorded_history:
        report.note = "the run has no checkpoint yet: nothing to replay"
        return report
    first = min(recorded)
    start = first if from_step is None else from_step
    report.from_step = start
    seed_snapshot = next(
        (s for s in reversed(recorded_history) if int(s.metadata.get("step", -1)) == start - 1),
        None,
    )
    if seed_snapshot is None or start not in recorded:
        raise UsageError(
            f"run {run_id} has no step {start}: its steps are {first} to {last(recorded)}"
        )
    seed = await saver.aget_tuple(seed_snapshot.config)
    assert seed is not None
    memory = InMemorySaver()
    await memory.aput(
        cast(RunnableConfig, {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}}),
        seed.checkpoint,
        seed.metadata,
        seed.checkpoint["channel_versions"],
    )
    effects = await rt.store.effects(run_id)
    thread = cast(RunnableConfig, {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    graph = compile_graph(workflow, memory)

    def root_step() -> int:
        latest = memory.get_tuple(thread)
        return int(latest.metadata.get("step", -1)) + 1 if latest is not None else start

    def root_tasks() -> dict[str, str]:
        state = graph.get_state(thread)
        return {"/".join(map(str, t.path)): str(t.id) for t in state.tasks}

    answers = _Answers(effects, await rt.store.waits(run_id), recorded, root_step, root_tasks)
    folder = Path(tempfile.mkdtemp(prefix="keel-replay-"))
    ctx = RunContext(
        run_id=run_id,
        job_id=str(run["job_id"]),
        workflow=workflow.name,
        token=0,
        worker_id="replay",
        services=dataclasses.replace(rt.services, artifacts_root=folder),
        locate=locate,
        pause=answers.pause,
        replay=answers,
        effect_keys=int(run.get("effect_keys") or 1),
    )
    answers.ctx = ctx
    limit = recursion_limit(run_config(run), graph, workflow.recursion_limit)
    config = {"configurable": {"thread_id": run_id}, "recursion_limit": limit}
    crash: Exception | None = None
    entered = enter(ctx)
    try:
        command: Any = None
        # A plain interrupt() really pauses the replayed graph: resumed as the run was.
        for _ in range(MAX_RESUMES):
            await graph.ainvoke(command, config)
            paused = await graph.aget_state(config)
            resume = answers.plain(paused) if paused.interrupts else None
            if resume is None:
                break
            command = Command(resume=resume)
    except _Stop:
        pass  # kept by `answers`
    except Exception as exc:
        crash = exc  # a node's error is also in the replayed checkpoints, compared below
    finally:
        leave(entered)
        shutil.rmtree(folder, ignore_errors=True)
    _, replayed = await read_steps(graph, memory, run_id, own_graph=True)
    replayed_folder = RunArtifacts(folder, run_id).folder
    relocate(replayed, str(replayed_folder), str(RunArtifacts(rt.artifacts_root, run_id).folder))
    report.effects_served = len(answers.calls)
    report.approvals_answered = len(answers.answered)
    judge(report, run, recorded, replayed, answers.stop, answers.calls, effects, start, crash)
    return report
