"""What a replay compares: a run's steps read from its root checkpoints, and the report.

keel.runtime.replay re-executes the run; this module reads the recorded and the replayed
checkpoints into steps (`read_steps`) and names the first step where they differ (`judge`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Literal, cast

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel, Field

from keel.core.lifecycle import FINISHED, Status
from keel.core.store.base import Row

What = Literal[
    "effect_key", "effect_arguments", "effect_missing", "approval", "writes",
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
class Step:
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


@dataclasses.dataclass(frozen=True)
class Halt:
    """Where and why a replay stopped inside a node (`difference` None: it need not go on)."""

    step: int
    difference: Difference | None
    note: str = ""


def ran(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, ...]:
    """The nodes that ran between two checkpoints: those whose `versions_seen` moved.

    Read from the checkpoints themselves, not from a graph: the graph the run used may be gone
    (a renamed node), and the current one would not see its route at all."""
    seen, later = before.get("versions_seen", {}), after.get("versions_seen", {})
    # LangGraph keeps its own entries there too (`__interrupt__`, `__input__`): not nodes.
    nodes = [n for n in later if n == "__start__" or not n.startswith("__")]
    return tuple(sorted(n for n in nodes if later[n] != seen.get(n)))


async def read_steps(
    graph: Any, saver: Any, run_id: str, *, own_graph: bool
) -> tuple[list[Any], dict[int, Step]]:
    """A thread's root checkpoints (oldest first) and its steps by number.

    `own_graph`: `graph` is the one that wrote the checkpoints (the replay's), so it can say
    where each step routed even when the next step did not finish."""
    config = cast(RunnableConfig, {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}})
    history = [s async for s in graph.aget_state_history(config)][::-1]
    raw = {
        t.config["configurable"]["checkpoint_id"]: t.checkpoint async for t in saver.alist(config)
    }
    by_checkpoint = {int(s.metadata.get("step", -1)): s for s in history}
    steps: dict[int, Step] = {}
    for number, snap in by_checkpoint.items():
        after = by_checkpoint.get(number + 1)
        route: tuple[str, ...] | None = None
        if after is not None:
            after_next = by_checkpoint.get(number + 2)
            if own_graph:
                route = tuple(sorted(set(after.next)))  # a fan-out's width: `tasks`
            elif after_next is not None:
                route = ran(raw[_id(after)], raw[_id(after_next)])
            elif not after.next and not after.tasks:
                route = ()  # the graph ended after this step
        steps[number + 1] = Step(
            ran=ran(raw[_id(snap)], raw[_id(after)]) if after is not None else (),
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


def _same(value: Any) -> Any:
    """What a write is compared by: messages without their ids. LangGraph's `add_messages`
    gives a message that has none (a ToolNode's answers, most hand-built ones) a new uuid on
    every execution, so its id tells nothing about what the node wrote."""
    if isinstance(value, BaseMessage):
        return value.model_copy(update={"id": None})
    if isinstance(value, dict):
        return {key: _same(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_same(item) for item in value)
    return value


def _id(snapshot: Any) -> str:
    return str(snapshot.config["configurable"]["checkpoint_id"])


def compare(
    number: int, recorded: Step, replayed: Step | None, calls: list[str],
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
        if path in replayed.tasks and _same(replayed.tasks[path][1]) != _same(writes):
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


def judge(
    report: ReplayReport, run: Row, recorded: dict[int, Step], replayed: dict[int, Step],
    stop: Halt | None, calls: list[str], effects: list[Row], start: int,
    crash: Exception | None,
) -> None:  # fmt: skip
    """Fill `report` with the first step whose replay differs from the recorded one: compared
    up to `stop` (if the replay stopped inside a node), `calls` the ledger keys it called."""
    finished = Status(run["status"]) in FINISHED
    last_recorded = last(recorded)
    end = max([*replayed, start])
    if stop is not None:
        end = max(end, stop.step)
    if end > last_recorded and not finished:
        report.note = (
            f"the run is {run['status']}: compared up to its last recorded step {last_recorded}"
        )
    for number in range(start, min(end, last_recorded) + 1):
        step = recorded.get(number, Step((), {}, None, {}, {}))
        stopped = stop is not None and stop.step == number
        found = compare(number, step, replayed.get(number), calls, effects, stopped)
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
        return
    beyond = [n for n in sorted(replayed) if n > last_recorded and replayed[n].ran]
    if finished and stop is None and beyond:
        # The run ended where its graph would have gone on (a graph edited under its version
        # finds no task for the checkpoint's next nodes and ends the run): the whole path
        # counts, not only the steps the run recorded.
        number = beyond[0]
        report.diverged, report.step, report.last_step = True, number, number
        report.nodes = list(replayed[number].ran)
        report.differences = [
            Difference(
                what="route",
                recorded=[],
                replayed=list(replayed[number].ran),
                detail=f"the run ended {run['status']} after step {last_recorded}; its graph "
                f"goes on and runs {', '.join(replayed[number].ran)} at step {number}",
            )
        ]


def relocate(steps: dict[int, Step], replayed_root: str, real_root: str) -> None:
    """Write the run's real artifact folder where the replay's throwaway one shows in its
    tasks' writes (a node that keeps `keel.artifacts().write_json(...)`'s path in its state):
    an unchanged graph writes the same path, wherever the replay put the file."""

    def moved(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(replayed_root, real_root)
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(moved(v) for v in value)
        return value

    for step in steps.values():
        step.tasks = {path: (node, moved(writes)) for path, (node, writes) in step.tasks.items()}


def last(steps: dict[int, Step]) -> int:
    """The last step that shows anything: finished tasks, a wait or a route."""
    shown = [n for n, s in steps.items() if s.tasks or s.interrupts or s.errors or s.route]
    return max(shown or [n for n, s in steps.items() if s.route is not None] or [min(steps)])
