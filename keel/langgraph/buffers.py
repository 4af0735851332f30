"""What the fenced saver keeps of an execution until it commits, and what it reads off a
step: its writes' buffer, whether a checkpoint is the run's last, how many bytes it writes.
(keel.langgraph.savers says when each commits.)"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import Checkpoint

from keel.core.context import StagedWrite
from keel.core.store.base import Statement

TASKS = "__pregel_tasks"  # LangGraph's channel of pending `Send`s (private since 1.0; a seam test)


@dataclass
class Buffered:
    """One task's writes, waiting for the checkpoint of their step."""

    token: int
    key: str
    """The `step` event's key: the same on a retry of its transaction, so it is added once."""
    event: dict[str, Any]
    staged: list[StagedWrite]
    recorded: asyncio.Future[list[Statement]]
    """Upstream's statements for these writes (PostgreSQL serializes them in a thread: the
    write takes its place in the buffer first, so a checkpoint saved meanwhile waits for it)."""


@dataclass
class Buffer:
    """What one execution (a run under one lease token) has not committed yet."""

    token: int
    worker_id: str
    writes: list[Buffered] = field(default_factory=list)
    settled: set[tuple[str, str]] = field(default_factory=set)
    """(namespace, checkpoint id) after an interrupt or error: no checkpoint will follow, so a
    sibling task that finishes later commits its writes at once (after an error), or with the
    execution's last transaction (after an interrupt: see `paused`)."""
    paused: set[tuple[str, str]] = field(default_factory=set)
    """(namespace, checkpoint id) where a task paused (`interrupt()`): its writes and its
    siblings' commit with the wait's registration (`Fencing.ending`), the one transaction that
    follows when the graph returns. Nothing of the graph reads them before (a read commits
    them first), and a crash before that commit runs the step's tasks again from its
    checkpoint, as a crash between the pause and a commit of its own would."""
    counts: dict[str, int] = field(default_factory=dict)
    deferred: list[Statement] = field(default_factory=list)
    """The input checkpoint of a run's first execution (and, after a plain START, the START
    step's), committed with the next transaction: until then the admission record holds the
    same input durably, and a crash before it restarts the run from there, as the checkpoints
    would."""
    input_step: int | None = None
    """The step of the deferred input checkpoint (-1 on a new thread; on a thread of many runs
    one past its latest): the START step's is the next."""
    final: list[Statement] | None = None
    """The checkpoint of the run's last step (one after which no task runs), held back with
    its step's writes to commit with the run's end (`Fencing.ending`): no code of the graph
    runs between them, so a crash between the two costs the last step again, as a crash in it
    would, and nothing of it is ever seen without the end."""


def is_last_step(checkpoint: Checkpoint, triggers: Mapping[str, Sequence[str]] | None) -> bool:
    """Whether LangGraph's loop will find no task to run after `checkpoint`: the test it makes
    itself (`prepare_next_tasks` with the channels the step updated and `trigger_to_nodes`), on
    the same inputs, where that test decides alone: no `Send` pending, channels updated, and
    the graph's triggers known (else LangGraph looks at every node, and so would this)."""
    updated = checkpoint.get("updated_channels")
    if not triggers or not updated:
        return False
    if TASKS in updated or checkpoint["channel_values"].get(TASKS):
        return False  # `Send`s pending (an empty list of them is none)
    return not any(triggers.get(channel) for channel in updated)


def values_size(*groups: Sequence[Statement]) -> int:
    """Bytes of the bytes and strings among the statements' values: upstream's blobs (on
    SQLite a checkpoint is one too). A JSON value (PostgreSQL's checkpoint) is not looked into:
    its connector sizes its statements itself (keel.backends.pg_batch)."""
    total = 0
    for statements in groups:
        for _sql, params, many in statements:
            for row in params if many else (params,):
                values = row.values() if isinstance(row, dict) else row or ()
                total += sum(len(v) for v in values if isinstance(v, bytes | str))
    return total


def write_key(token: int, where: tuple[str, str], task_id: str, n: int) -> str:
    return f"{token}/{where[0]}/{where[1]}/{task_id}/{n}"
