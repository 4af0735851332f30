"""Identity: readable job ids, deterministic run ids and idempotency keys, canonical hashing.

Nothing here reads the clock or a random source: the same inputs give the same ids on every
machine and every replay.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keel.core.codec import canonical_json
from keel.core.errors import InvalidId

MAX_JOB_ID = 100
MAX_RUN_ID = 128
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_SLUG_STRIP = re.compile(r"[^a-z0-9]+")


def digest(*parts: str) -> str:
    """sha256 over length-prefixed parts, so ("ab","c") and ("a","bc") differ."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def slug(text: str) -> str:
    return _SLUG_STRIP.sub("-", text.lower()).strip("-")


def job_id(*parts: str | dt.date | int) -> str:
    """A readable, stable job id from its parts.

    >>> job_id("newsletter", dt.date(2026, 8, 7), "AI Signals")
    'newsletter-2026-08-07-ai-signals'
    """
    pieces = [slug(p.isoformat() if isinstance(p, dt.date) else str(p)) for p in parts]
    value = "-".join(p for p in pieces if p)
    return validate_job_id(value)


def validate_job_id(value: str) -> str:
    return _validate(value, "job_id", MAX_JOB_ID)


def validate_run_id(value: str) -> str:
    return _validate(value, "run_id", MAX_RUN_ID)


def _validate(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidId(f"{what} must be a non-empty string")
    if len(value) > limit:
        raise InvalidId(f"{what} is {len(value)} characters long; the limit is {limit}")
    if not _ID_RE.fullmatch(value):
        raise InvalidId(
            f"{what} {value[:60]!r} may only contain lowercase letters, digits, '.', '_' and '-', "
            "and must start with a letter or digit"
        )
    return value


def whole_number(text: str | None, digits: int = 18) -> int | None:
    """The whole number `text` spells in ASCII digits (at most `digits` of them, so it fits a
    64-bit column), or None. Not `str.isdigit`: it takes "²" and "٣", which `int()` refuses or
    reads, and thousands of digits, past which `int()` refuses too: a 500 for a header."""
    text = (text or "").strip()
    if not (0 < len(text) <= digits and text.isascii() and text.isdigit()):
        return None
    return int(text)


def input_hash(workflow: str, version: str, input_json: str) -> str:
    return digest(workflow, version, input_json)


def run_id(job: str, workflow: str, version: str, input_json: str, attempt: int = 1) -> str:
    """job_id + 16 hex of sha256(job, workflow, version, canonical input) [+ -aN for reruns]."""
    validate_job_id(job)
    if attempt < 1:
        raise InvalidId("attempt starts at 1")
    base = f"{job}-{digest(job, workflow, version, input_json)[:16]}"
    return base if attempt == 1 else f"{base}-a{attempt}"


def args_hash(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    return digest(canonical_json({"args": list(args), "kwargs": dict(kwargs)}))[:32]


@dataclasses.dataclass(frozen=True)
class StepRef:
    """Where in a run a call happens: the parts an idempotency key is made of."""

    run_id: str
    node: str
    step: int
    path: str
    namespace: str = ""
    scope: object = dataclasses.field(default=None, compare=False, hash=False, repr=False)
    """The one attempt of the task at this place (not part of any key): it tells a task's
    retry, which counts its effect calls from the first again, from a later call."""
    task_id: str = dataclasses.field(default="", compare=False, hash=False, repr=False)
    """LangGraph's id of the running task (not part of any key): the saver commits what the
    task staged (`RunContext.stage`) with the writes it puts under this id."""

    def key(self, kind: str, name: str, content_hash: str) -> str:
        return (
            f"{kind}:{name}:"
            + digest(
                self.run_id,
                self.namespace,
                self.node,
                str(self.step),
                self.path,
                name,
                content_hash,
            )[:32]
        )


def namespace_without_task_ids(checkpoint_ns: str) -> str:
    """'outer:<task-id>|inner:<task-id>' -> 'outer:<task-id>|inner'.

    The calling task's own id is dropped: node, step and task path already locate it, and it
    embeds the id of a checkpoint that a replay from an earlier checkpoint would not reproduce.
    Ancestors' task ids are kept: they are what tells two invocations of one subgraph apart
    (parallel Sends, loop iterations), and they are stable because the parent's checkpoint is
    durable before the parent task runs.
    """
    head, sep, last = checkpoint_ns.rpartition("|")
    return f"{head}{sep}{last.split(':', 1)[0]}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(value: str, what: str = "name") -> str:
    """A single path component that cannot escape its folder."""
    cleaned = _UNSAFE.sub("_", value)[:200]
    if cleaned.strip(".") == "" or cleaned.startswith("."):
        raise InvalidId(f"{what} {value!r} cannot be used as a file or folder name")
    return cleaned


@dataclass(frozen=True)
class Identity:
    """The arguments of one call that identify it, hashed."""

    hashes: dict[str, str]
    """Per compared argument name, a hash of its canonical JSON."""

    @property
    def digest(self) -> str:
        return digest(canonical_json(self.hashes))[:32]

    def changed(self, recorded: Mapping[str, str] | None) -> list[str]:
        """The names whose hash differs from `recorded` (added and removed names included)."""
        if recorded is None:
            return []
        names = sorted(set(recorded) | set(self.hashes))
        return [n for n in names if recorded.get(n) != self.hashes.get(n)]


class CallOrder:
    """Counts a run's effect calls per task execution, to number repeated calls of an effect,
    and remembers where a task execution's call was refused as changed (`refuse`).

    A task execution is named by `StepRef.scope`, an object LangGraph makes once per attempt
    of a task (a retried node starts counting from 0 again, as it starts from its first line).
    Counters of earlier steps of the same namespace are dropped: those tasks have finished.
    Parallel tool calls of one task count from their threads at once: one lock for all.
    """

    def __init__(self) -> None:
        # task -> (scope, step, namespace, counts); a scope object is held so its id stays
        # unique while it is counted.
        self._tasks: dict[object, tuple[object, int, str, Counter[str]]] = {}
        self._refused: dict[tuple[object, str | None], Exception] = {}
        self._lock = threading.Lock()

    def next(self, where: StepRef, name: str) -> int:
        with self._lock:
            counts = self._entry(where, start=True)
            assert counts is not None
            call = counts[name]
            counts[name] += 1
            return call

    def refuse(self, where: StepRef, within: str | None, error: Exception) -> None:
        """The task at `where` diverged from its recorded run (`error`) in tool call `within`
        (None: outside any): its later calls there, another coroutine's among them, are
        refused too, never performed. Other tool calls of the task go on."""
        with self._lock:
            if self._entry(where, start=False) is not None:
                self._refused.setdefault((self._task(where), within), error)

    def refusal(self, where: StepRef, within: str | None) -> Exception | None:
        """Why the task at `where` refuses its calls in tool call `within`, if it does."""
        with self._lock:
            if self._entry(where, start=False) is None:
                return None  # another attempt of the task (or none yet): it starts afresh
            return self._refused.get((self._task(where), within))

    def _entry(self, where: StepRef, *, start: bool) -> Counter[str] | None:
        """The counts of the task execution at `where`; with `start`, a new one replaces what
        an earlier attempt of it, or a finished step's task, left."""
        task = self._task(where)
        entry = self._tasks.get(task)
        if entry is not None and (where.scope is None or entry[0] is where.scope):
            return entry[3]
        if not start:
            return None
        self._tasks = {
            t: e
            for t, e in self._tasks.items()
            if not (e[2] == where.namespace and e[1] < where.step)
        }
        self._tasks.pop(task, None)
        self._refused = {k: e for k, e in self._refused.items() if k[0] in self._tasks}
        entry = (where.scope, where.step, where.namespace, Counter())
        self._tasks[task] = entry
        return entry[3]

    @staticmethod
    def _task(where: StepRef) -> object:
        # Without a scope (a node played by hand) the place itself names the task.
        return where if where.scope is None else id(where.scope)
