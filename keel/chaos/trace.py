"""What the clean run's fault trace says: where each fault point occurrence was (which node,
task path and effect), which outside deliveries happened where, and so which cells are the risky
ones (those right after a delivery) that sampling must never skip.

Worker processes of the clean run append their trace to `<record>.<phase>` at exit, the decider
of phase N to `<record>.d<N>` (see keel.core.faults). The sinks stamp each delivery with the same
system-wide monotonic clock, so a delivery falls between two trace entries of the process that
made it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from keel.chaos.world import Delivery

EFFECT_POINTS = (
    "effect.before_reserve",
    "effect.before_call",
    "effect.after_perform",
    "effect.after_record",
)
BEFORE_CALL = ("effect.before_reserve", "effect.before_call")


@dataclass
class Occurrence:
    """One fault point reached in the clean run: the place a cell arms."""

    phase: int
    point: str
    occurrence: int
    label: str
    node: str
    """The node running (effects, a task's writes), or "" where the caller cannot tell."""
    path: str
    at_ns: int
    after: list[str] = field(default_factory=list)
    """The nodes that ran just before (a checkpoint commits their step)."""

    @property
    def effect(self) -> str:
        return self.label if self.point in EFFECT_POINTS else ""

    @property
    def where(self) -> str:
        """A sentence part naming the code this occurrence interrupts."""
        task = f" (`Send` task {self.path})" if _pushed(self.path) else ""
        if self.point in EFFECT_POINTS:
            return f"effect `{self.label}` in node `{self.node}`{task}"
        if self.point == "checkpoint.before_write" and self.node:
            return f"saving the writes of node `{self.node}`{task}"
        if self.point == "checkpoint.before_write" and task:
            return f"saving the writes of a{task}"
        names = ", ".join(f"`{n}`" for n in self.after)
        if self.point == "checkpoint.before_write":
            return f"the checkpoint after node {names}" if names else "the input checkpoint"
        if self.point == "decision.after_record":
            return "the decision, recorded" + (f", after node {names}" if names else "")
        base = f"{self.point}" + (f" `{self.label}`" if self.label else "")
        return f"{base} after node {names}" if names else f"{base} before any node"


@dataclass
class Attributed:
    """A delivery of the clean run, and the code that made it."""

    delivery: Delivery
    phase: int
    node: str
    effect: str
    """The effect it was made in, or "" if it happened outside any `@keel.effect`."""


@dataclass
class Trace:
    occurrences: list[Occurrence]
    deliveries: list[Attributed]

    def find(self, phase: int, point: str, occurrence: int) -> Occurrence | None:
        for o in self.occurrences:
            if (o.phase, o.point, o.occurrence) == (phase, point, occurrence):
                return o
        return None

    def risky(self) -> dict[tuple[int, str, int], list[Attributed]]:
        """The cells right after each delivery: per fault point, its first occurrence after the
        delivery in the same phase. A crash there is what could make the world see it again."""
        found: dict[tuple[int, str, int], list[Attributed]] = {}
        for made in self.deliveries:
            seen: set[str] = set()
            for o in self.occurrences:
                if o.phase != made.phase or o.at_ns <= made.delivery.at_ns or o.point in seen:
                    continue
                seen.add(o.point)
                found.setdefault((o.phase, o.point, o.occurrence), []).append(made)
        return found


Entry = tuple[str, str, str, str, int]


def read_trace(record: Path) -> tuple[list[list[list[Entry]]], list[tuple[int, int, int]]]:
    """Per phase, per process (in the order they started), the trace entries; and each
    process's (start, end, phase) on the monotonic clock."""
    phases: dict[int, list[list[Entry]]] = {}
    spans: list[tuple[int, int, int]] = []
    for path in record.parent.glob(record.name + ".*"):
        suffix = path.name.rsplit(".", 1)[-1]
        phase = int(suffix.removeprefix("d"))
        for line in path.read_text().splitlines():
            data = json.loads(line)
            entries: list[Entry] = [tuple(e) for e in data.get("trace", [])]
            if suffix.startswith("d"):  # a decider reaches only this point of its own
                entries = [e for e in entries if e[0] == "decision.after_record"]
            if "span" in data:
                spans.append((int(data["span"][0]), int(data["span"][1]), phase))
            if entries:
                phases.setdefault(phase, []).append(entries)
    for processes in phases.values():
        processes.sort(key=lambda p: p[0][4])
    per_phase = [phases.get(i, []) for i in range(max(phases) + 1)] if phases else []
    return per_phase, spans


def task_path(path: str) -> str:
    """A task path as a saver is given it (`~__pregel_push, 0000000001, False`) or as a node
    sees it (`__pregel_push/1/False`), in the second form."""
    parts = [p.strip() for p in path.lstrip("~").split("," if "," in path else "/")]
    return "/".join(str(int(p)) if p.isdigit() else p for p in parts)


def _pushed(path: str) -> bool:
    return "__pregel_push" in path


def build(record: Path, deliveries: Iterable[Delivery]) -> Trace:
    occurrences: list[Occurrence] = []
    per_phase, spans = read_trace(record)
    # A `Send` task's writes name only its task path; its effects name its node too.
    nodes_of = {
        task_path(e[3]): e[2]
        for processes in per_phase
        for entries in processes
        for e in entries
        if e[0] in EFFECT_POINTS and e[2] and e[3]
    }
    for phase, processes in enumerate(per_phase):
        counts: dict[str, int] = {}
        for entries in processes:
            ran: list[str] = []  # nodes whose writes were saved since the last checkpoint
            last: list[str] = []
            reserved: dict[str, tuple[str, str]] = {}  # effect -> (node, path) of its reserve
            for point, label, node, path, at_ns in entries:
                counts[point] = counts.get(point, 0) + 1
                if point == "effect.before_reserve":
                    reserved[label] = (node, path)
                elif point in EFFECT_POINTS and not node:  # the call site knows only the effect
                    node, path = reserved.get(label, ("", ""))
                if point == "checkpoint.before_write" and _pushed(node):
                    path = task_path(node)
                    node = nodes_of.get(path, "")
                elif path:
                    path = task_path(path)
                o = Occurrence(phase, point, counts[point], label, node, path, at_ns)
                if point == "checkpoint.before_write" and (node or path):
                    ran.append(node or f"Send {path}")
                    o.after = list(last)
                elif point == "checkpoint.before_write":
                    o.after = list(dict.fromkeys(ran)) or list(last)
                    last, ran = o.after or last, []
                else:
                    o.after = list(dict.fromkeys(ran)) or list(last)
                occurrences.append(o)
    occurrences.sort(key=lambda o: o.at_ns)
    return Trace(occurrences, [_attribute(d, occurrences, spans) for d in deliveries])


def _attribute(
    delivery: Delivery, occurrences: list[Occurrence], spans: list[tuple[int, int, int]]
) -> Attributed:
    before = [o for o in occurrences if o.at_ns < delivery.at_ns]
    after = [o for o in occurrences if o.at_ns > delivery.at_ns]
    # The phase of the process alive when it arrived; else that of the last point before it.
    alive = [p for start, end, p in spans if start <= delivery.at_ns <= end]
    phase = alive[0] if alive else (before[-1].phase if before else 0)
    before = [o for o in before if o.phase == phase]
    after = [o for o in after if o.phase == phase]
    # Inside an effect: the last effect point before it is one before the call, the next one
    # after it is that effect's after_perform (other points, a heartbeat, may come between).
    prev = next((o for o in reversed(before) if o.point in EFFECT_POINTS), None)
    nxt = next((o for o in after if o.point in EFFECT_POINTS), None)
    if (
        prev is not None
        and nxt is not None
        and prev.point in BEFORE_CALL
        and nxt.point == "effect.after_perform"
        and prev.label == nxt.label
    ):
        return Attributed(delivery, phase, prev.node or nxt.node, prev.label)
    # Outside any effect: the node is the next one whose writes are saved.
    node = next((o.node for o in after if o.node), "")
    return Attributed(delivery, phase, node, "")


def sample(count: int, cap: int | None) -> list[int]:
    """Occurrences 1..count, or at most `cap` of them: the first, the last, evenly between."""
    if cap is None or count <= cap:
        return list(range(1, count + 1))
    if cap <= 1:
        return [1]
    step = (count - 1) / (cap - 1)
    return sorted({round(1 + i * step) for i in range(cap)})
