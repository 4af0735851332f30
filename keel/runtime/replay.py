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
hashes), each task's writes, and the route (the nodes that run next). The first step with a
difference is the report's `step`.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import BaseModel, Field

from keel.core.codec import loads
from keel.core.context import RunContext, enter, leave
from keel.core.effect_keys import Identity, effect_key
from keel.core.errors import KeelError, RunNotFound, UsageError
from keel.core.ids import StepRef, validate_run_id
from keel.core.ledger import SETTLED, changed_arguments, recorded_result
from keel.core.lifecycle import FINISHED, Status
from keel.core.store.base import Row
from keel.core.wait_model import WaitKind, WaitStatus
from keel.langgraph.executor import compile_graph, locate

if TYPE_CHECKING:
    from keel.runtime.runtime import Runtime

What = Literal[
    "effect_key", "effect_arguments", "effect_unsettled", "effect_missing", "approval", "writes",
    "tasks", "route", "error",
]  # fmt: skip


class Difference(BaseModel):
    """One thing the replay did otherwise than the recorded run, at the report's step."""

    what: What
    node: str | None = None
    recorded: Any = None
    replayed: Any = None
    detail: str = ""


class ReplayReport(BaseModel):
    """What `keel runs replay` found: the first diverging step, or none."""

    run_id: str
    workflow: str
    version: str
    status: str
    """The recorded run's status when it was replayed."""
    from_step: int
    last_step: int | None = None
    """The last step the replay compared."""
    diverged: bool = False
    step: int | None = None
    """The first step that diverged (None: no divergence)."""
    nodes: list[str] = Field(default_factory=list)
    """The recorded nodes of that step."""
    differences: list[Difference] = Field(default_factory=list)
    effects_served: int = 0
    approvals_answered: int = 0
    note: str | None = None


@dataclasses.dataclass
class _Step:
    """One step of a run as its root graph's checkpoints show it."""

    ran: tuple[str, ...]
    """The nodes that ran in the step (if it finished)."""
    tasks: dict[str, tuple[str, Any]]
    """Task path -> (node, writes) of the tasks that finished the step."""
    route: tuple[str, ...] | None
    """The nodes that run next (None: the step did not finish)."""
    errors: dict[str, str]
    interrupts: dict[str, list[str]]
    """Task path -> the ids of the interrupts it paused on, in order."""
    ids: dict[str, str] = dataclasses.field(default_factory=dict)
    """Task path -> task id, of every task of the step."""


class _Stop(KeelError):
    """Ends a replay inside a node: it cannot go on like the recorded run (or need not)."""

    def __init__(self, step: int, difference: Difference | None, note: str = "") -> None:
        super().__init__(note or (difference.detail if difference else "replay stopped"))
        self.step, self.difference, self.note = step, difference, note


class _Answers:
    """The replay's effects and approvals, answered from what the run recorded."""

    def __init__(
        self,
        effects: list[Row],
        waits: list[Row],
        recorded: dict[int, _Step],
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
        self.approvals = 0
        self.ctx: RunContext | None = None
        self.stop: _Stop | None = None
        """The first stop, kept here too: a node that catches every exception cannot hide it."""

    def _stop(self, where: StepRef, difference: Difference | None, note: str = "") -> _Stop:
        stop = _Stop(where.step if not where.namespace else self.root_step(), difference, note)
        self.stop = self.stop or stop
        return stop

    def effect(
        self, name: str, key: str, legacy_key: str, where: StepRef, index: int, identity: Identity
    ) -> Any:
        legacy = self.effects.get(legacy_key)
        row = legacy if legacy is not None and legacy["arg_hashes"] is None else None
        if row is None and where.namespace and key not in self.effects:
            key = effect_key(self._as_recorded(where), name, index)
        row = row or self.effects.get(key)
        if row is None:
            raise self._stop(
                where,
                Difference(
                    what="effect_key",
                    node=where.node,
                    replayed={"effect": name, "key": key},
                    detail=f"effect {name!r} under key {key}, which the run never had "
                    "(not performed)",
                ),
            )
        self.calls.append(str(row["idempotency_key"]))
        changed = changed_arguments(row, identity)
        if changed:
            raise self._stop(
                where,
                Difference(
                    what="effect_arguments",
                    node=where.node,
                    recorded={"effect": row["name"], "key": key, "args_hash": row["args_hash"]},
                    replayed={"effect": name, "key": key, "args_hash": identity.digest},
                    detail=f"effect {name!r} called with other arguments: {', '.join(changed)}",
                ),
            )
        if row["status"] not in SETTLED:
            raise self._stop(
                where,
                Difference(
                    what="effect_unsettled",
                    node=where.node,
                    recorded={"effect": name, "key": key, "status": row["status"]},
                    detail=f"effect {name!r} is {row['status']} in the ledger: the run never "
                    "learnt its result, so the replay cannot go past it",
                ),
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
        name = spec.get("keel_wait", {}).get("name") if isinstance(spec, dict) else None
        wait = self._recorded_wait(where, name)
        if wait is not None and wait["status"] == WaitStatus.PENDING:
            raise self._stop(
                where, None, f"reached the wait {wait['wait_id']} the run is waiting on"
            )
        if wait is None:
            raise self._stop(
                where,
                Difference(
                    what="approval",
                    node=where.node,
                    replayed={"wait": name},
                    detail=f"a wait {name!r} the run never had at this place",
                ),
            )
        self.answered.add(str(wait["interrupt_id"]))
        self.approvals += 1
        return loads(wait["value"])

    def _recorded_wait(self, where: StepRef, name: str | None) -> Row | None:
        """The recorded wait at this pause's place: the same task's n-th wait; inside a
        subgraph (whose task paths the root checkpoints do not show), the first not yet
        answered wait of the same name in the same root step."""
        assert self.ctx is not None
        if not where.namespace:
            step = self.recorded.get(where.step)
            ids = [i for i in (step.interrupts.get(where.path, []) if step else [])]
            ids = [
                i for i in ids if i not in self.waits or self.waits[i]["kind"] != WaitKind.EFFECT
            ]
            index = self.ctx.calls.next(where, "\0wait")
            return self.waits.get(ids[index]) if index < len(ids) else None
        step = self.recorded.get(self.root_step())
        for ids in step.interrupts.values() if step else []:
            for i in ids:
                wait = self.waits.get(i)
                if wait is None or i in self.answered or wait["kind"] == WaitKind.EFFECT:
                    continue
                if wait["name"] == name:
                    return wait
        return None


def _ran(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, ...]:
    """The nodes that ran between two checkpoints: those whose `versions_seen` moved.

    Read from the checkpoints themselves, not from a graph: the graph the run used may be gone
    (a renamed node), and the current one would not see its route at all."""
    seen, later = before.get("versions_seen", {}), after.get("versions_seen", {})
    # LangGraph keeps its own entries there too (`__interrupt__`, `__input__`): not nodes.
    nodes = [n for n in later if n == "__start__" or not n.startswith("__")]
    return tuple(sorted(n for n in nodes if later[n] != seen.get(n)))


async def _steps(
    graph: Any, saver: Any, run_id: str, *, own_graph: bool
) -> tuple[list[Any], dict[int, _Step]]:
    """A thread's root checkpoints (oldest first) and its steps by number.

    `own_graph`: `graph` is the one that wrote the checkpoints (the replay's), so it can say
    where each step routed even when the next step did not finish."""
    config = cast(RunnableConfig, {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    history = [s async for s in graph.aget_state_history(config)][::-1]
    raw = {
        t.config["configurable"]["checkpoint_id"]: t.checkpoint async for t in saver.alist(config)
    }
    by_checkpoint = {int(s.metadata.get("step", -1)): s for s in history}
    steps: dict[int, _Step] = {}
    for number, snap in by_checkpoint.items():
        after = by_checkpoint.get(number + 1)
        route: tuple[str, ...] | None = None
        if after is not None:
            after_next = by_checkpoint.get(number + 2)
            if own_graph:
                route = tuple(sorted(set(after.next)))  # a fan-out's width: `tasks`
            elif after_next is not None:
                route = _ran(raw[_id(after)], raw[_id(after_next)])
            elif not after.next and not after.tasks:
                route = ()  # the graph ended after this step
        steps[number + 1] = _Step(
            ran=_ran(raw[_id(snap)], raw[_id(after)]) if after is not None else (),
            tasks={
                "/".join(map(str, t.path)): (t.name, t.result)
                for t in snap.tasks
                if t.result is not None
            },
            route=route,
            errors={"/".join(map(str, t.path)): str(t.error) for t in snap.tasks if t.error},
            ids={"/".join(map(str, t.path)): str(t.id) for t in snap.tasks},
            interrupts={
                "/".join(map(str, t.path)): [i.id for i in t.interrupts]
                for t in snap.tasks
                if t.interrupts
            },
        )
    return history, steps


def _id(snapshot: Any) -> str:
    return str(snapshot.config["configurable"]["checkpoint_id"])


def _compare(
    number: int, recorded: _Step, replayed: _Step | None, calls: list[str],
    effects: list[Row], stopped: bool,
) -> list[Difference]:  # fmt: skip
    if replayed is None:
        return []
    found: list[Difference] = []
    nodes = set(recorded.ran) or {name for name, _ in recorded.tasks.values()}
    if replayed.route is not None:
        # A recorded key of this step that the finished replayed step never called.
        called = set(calls)
        for row in effects:
            if (
                row["step"] == number
                and row["node"] in nodes
                and row["idempotency_key"] not in called
            ):
                found.append(
                    Difference(
                        what="effect_missing",
                        node=row["node"],
                        recorded={"effect": row["name"], "key": row["idempotency_key"]},
                        detail=f"the replay did not call effect {row['name']!r}",
                    )
                )
    for path, (node, writes) in recorded.tasks.items():
        if path in replayed.tasks and replayed.tasks[path][1] != writes:
            found.append(
                Difference(
                    what="writes",
                    node=node,
                    recorded=writes,
                    replayed=replayed.tasks[path][1],
                    detail=f"node {node!r} wrote other values",
                )
            )
    for path, error in recorded.errors.items():
        if path in replayed.tasks and path not in replayed.errors:
            found.append(
                Difference(
                    what="error",
                    node=replayed.tasks[path][0],
                    recorded=error,
                    replayed=None,
                    detail="the recorded node raised, the replayed one did not",
                )
            )
    for path, error in replayed.errors.items():
        # A replay stopped in this step raised its own stop inside the node: not the node's.
        if not stopped and recorded.errors.get(path) != error:
            found.append(
                Difference(
                    what="error",
                    node=path.rsplit("/", 1)[-1],
                    recorded=recorded.errors.get(path),
                    replayed=error,
                    detail="the replayed node raised",
                )
            )
    if None not in (recorded.route, replayed.route):
        ran = Counter(name for name, _ in recorded.tasks.values())
        again = Counter(name for name, _ in replayed.tasks.values())
        if ran != again:
            found.append(
                Difference(
                    what="tasks",
                    node=", ".join(sorted(set(ran) | set(again))) or None,
                    recorded=dict(sorted(ran.items())),
                    replayed=dict(sorted(again.items())),
                    detail="other tasks ran in this step (a fan-out of another width?)",
                )
            )
    if None not in (recorded.route, replayed.route) and recorded.route != replayed.route:
        found.append(
            Difference(
                what="route",
                node=", ".join(sorted(nodes)) or None,
                recorded=list(recorded.route or ()),
                replayed=list(replayed.route or ()),
                detail="the next nodes differ",
            )
        )
    return found


async def replay(rt: Runtime, run_id: str, from_step: int | None = None) -> ReplayReport:
    """Replay `run_id` from `from_step` (default: its first step) and report the divergence."""
    await rt.open()
    validate_run_id(run_id)
    run = await rt.store.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run {run_id!r}")
    workflow = rt.workflows.get(run["workflow"], run["workflow_version"])
    saver = rt.fencing()
    recorded_history, recorded = await _steps(
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
            f"run {run_id} has no step {start}: its steps are {first} to {_last(recorded)}"
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
    )
    answers.ctx = ctx
    config = {"configurable": {"thread_id": run_id}, "recursion_limit": workflow.recursion_limit}
    crash: Exception | None = None
    entered = enter(ctx)
    try:
        await graph.ainvoke(None, config)
    except _Stop:
        pass  # kept by `answers`
    except Exception as exc:
        crash = exc  # a node's error is also in the replayed checkpoints, compared below
    finally:
        leave(entered)
        shutil.rmtree(folder, ignore_errors=True)
    _, replayed = await _steps(graph, memory, run_id, own_graph=True)
    report.effects_served = len(answers.calls)
    report.approvals_answered = answers.approvals
    _judge(report, run, recorded, replayed, answers, effects, start, crash)
    return report


def _judge(
    report: ReplayReport, run: Row, recorded: dict[int, _Step], replayed: dict[int, _Step],
    answers: _Answers, effects: list[Row], start: int, crash: Exception | None,
) -> None:  # fmt: skip
    """Fill `report` with the first step whose replay differs from the recorded one."""
    stop = answers.stop
    finished = Status(run["status"]) in FINISHED
    last_recorded = _last(recorded)
    end = max([*replayed, start])
    if stop is not None:
        end = max(end, stop.step)
    if end > last_recorded and not finished:
        report.note = (
            f"the run is {run['status']}: compared up to its last recorded step {last_recorded}"
        )
    for number in range(start, min(end, last_recorded) + 1):
        step = recorded.get(number, _Step((), {}, None, {}, {}))
        stopped = stop is not None and stop.step == number
        found = _compare(number, step, replayed.get(number), answers.calls, effects, stopped)
        if stop is not None and stopped and stop.difference is not None:
            found.insert(0, stop.difference)
        report.last_step = number
        if found:
            report.diverged = True
            report.step = number
            report.nodes = list(step.ran) or sorted(
                {name for name, _ in step.tasks.values()}
                | {path.rsplit("/", 1)[-1] for path in step.errors}
            )
            report.differences = found
            return
        if stopped:
            report.note = stop.note if stop is not None and stop.note else report.note
            return
    if crash is not None and not (run["error"] and type(crash).__name__ in str(run["error"])):
        # The replay failed where no task error shows it (outside the nodes), the run did not.
        report.diverged = True
        report.step = report.last_step
        report.differences = [
            Difference(
                what="error",
                recorded=run["error"],
                replayed=f"{type(crash).__name__}: {crash}",
                detail="the replay failed",
            )
        ]


def _last(steps: dict[int, _Step]) -> int:
    """The last step that shows anything: finished tasks, a wait or a route."""
    shown = [n for n, s in steps.items() if s.tasks or s.interrupts or s.errors or s.route]
    return max(shown or [n for n, s in steps.items() if s.route is not None] or [min(steps)])
