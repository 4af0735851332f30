"""The bodies of the HTTP API's thread endpoints (keel/service/threads_api.py).

Their shapes follow the LangGraph Agent Server's thread resources where Keel has the same idea
(a thread's state is `keel.runtime.snapshot_json.state_json`, field for field); runs stay
Keel's runs, with their place on the thread beside them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from keel.core.codec import loads
from keel.core.store.base import Row
from keel.service.models import Approval, Body, Run, run_model

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
Strategy = Literal["reject", "enqueue", "interrupt", "rollback"]
WAIT_ID = r"^[a-z0-9][a-z0-9._-]*$"

# -- requests --------------------------------------------------------------------------------


class ThreadIn(Body):
    thread_id: str | None = Field(
        None,
        min_length=1,
        description="The thread's id (letters, digits, '.', '_', '-'); a UUID if omitted.",
    )
    workflow: str = Field(min_length=1, max_length=200, description="A registered workflow.")
    metadata: dict[str, Any] | None = Field(None, description="Any JSON object, searchable.")
    if_exists: Literal["raise", "do_nothing"] = Field(
        "raise",
        description="When a thread of that id exists: refuse (409 thread_exists), or answer it "
        "(200).",
    )


class ThreadPatch(Body):
    metadata: dict[str, Any] = Field(description="Keys merged into the thread's metadata.")


class CopyIn(Body):
    to: str | None = Field(
        None, min_length=1, description="The new thread's id; a UUID if omitted."
    )


class ThreadSearchIn(Body):
    metadata: dict[str, Any] | None = Field(
        None, description="Only threads whose metadata holds each of these keys and values."
    )
    status: ThreadStatus | None = None
    workflow: str | None = Field(None, max_length=200)
    limit: int = Field(10, ge=1, le=500)
    offset: int = Field(0, ge=0)


class CommandIn(Body):
    """LangGraph's Command: `resume` answers the thread's pending interrupt; `update` and/or
    `goto` start a run with them."""

    resume: Any = Field(None, description="What the pending `interrupt()` returns.")
    update: Any = Field(None, description="State written before the run starts.")
    goto: str | list[str] | None = Field(None, description="The node(s) to start at.")

    def as_dict(self) -> dict[str, Any]:
        """Only the keys the caller sent: `"resume": null` is an answer, an absent one is not."""
        return {name: getattr(self, name) for name in sorted(self.model_fields_set)}


class ThreadRunIn(Body):
    workflow: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="The thread's workflow; needed only to create the thread with this run.",
    )
    input: Any = Field(None, description="Merged into the thread's state through its reducers.")
    command: CommandIn | None = None
    config: dict[str, Any] | None = Field(
        None, description="LangGraph's config: its `configurable` and `metadata` reach the graph."
    )
    context: Any = Field(None, description="The graph's runtime context.")
    checkpoint_id: str | None = Field(
        None, max_length=200, description="Fork: start from this past checkpoint of the thread."
    )
    multitask_strategy: Strategy = Field(
        "enqueue", description="What to do while another run of the thread is unfinished."
    )
    metadata: dict[str, Any] | None = Field(
        None, description="The thread's metadata, kept when this run creates the thread."
    )
    job_id: str | None = Field(
        None,
        min_length=1,
        description="Idempotency key: the same job, input and command on the thread are one run.",
    )
    version: str | None = Field(None, description="Workflow version; the latest when omitted.")
    after: float | str | None = Field(
        None,
        description='Delay the run: seconds, or a duration such as "5m". It takes its place '
        "on the thread now and is claimed once the database's clock reaches that time.",
    )


class ResumeValueIn(Body):
    value: Any = Field(description="What the pending `interrupt()` returns: any JSON value.")
    comment: str | None = Field(None, max_length=10_000)
    by: str | None = Field(None, max_length=200, description="Who answers; defaults to the token.")
    action_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Deduplication key; the Idempotency-Key header takes precedence.",
    )
    wait_id: str | None = Field(
        None,
        max_length=200,
        pattern=WAIT_ID,
        description="The wait to answer, when the run waits on several.",
    )


class StateUpdateIn(Body):
    values: Any = Field(description="Written as if `as_node` returned it (through reducers).")
    as_node: str | None = Field(None, min_length=1, max_length=200)
    timeout: float = Field(
        10.0,
        ge=0,
        le=60,
        description="Seconds to wait for a worker to write it; 202 with the run after that.",
    )


# -- responses -------------------------------------------------------------------------------


class Thread(BaseModel):
    thread_id: str
    workflow: str
    workflow_version: str
    metadata: dict[str, Any]
    status: ThreadStatus = Field(
        description="From its runs: busy (one queued or running), interrupted (the active run "
        "waits for input), error (the last run failed), else idle."
    )
    runs: int = Field(description="How many runs the thread holds.")
    created_at: float
    updated_at: float
    url: str


class ThreadPage(BaseModel):
    threads: list[Thread]
    limit: int
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null on the last one.")


class ThreadRun(Run):
    thread_id: str | None = Field(description="Null for a run that is a thread of its own.")
    thread_seq: int | None = Field(description="The run's place in its thread's order, from 1.")
    multitask_strategy: str | None


class WaitedRun(ThreadRun):
    output: Any = Field(description="The graph's final values, once it completed.")


class CheckpointRef(BaseModel):
    thread_id: str | None
    checkpoint_ns: str
    checkpoint_id: str | None


class Interrupt(BaseModel):
    value: Any
    id: str


class StateTask(BaseModel):
    id: str
    name: str
    path: list[Any]
    error: str | None
    interrupts: list[Interrupt]
    result: Any


class ThreadState(BaseModel):
    """LangGraph's StateSnapshot as JSON (`keel.runtime.snapshot_json.state_json`)."""

    values: Any
    next: list[str]
    tasks: list[StateTask]
    interrupts: list[Interrupt]
    metadata: dict[str, Any] | None
    created_at: str | None
    checkpoint: CheckpointRef | None
    checkpoint_id: str | None
    parent_checkpoint: CheckpointRef | None
    parent_checkpoint_id: str | None


class StateUpdated(BaseModel):
    checkpoint: CheckpointRef | None = Field(description="The checkpoint written; null on 202.")
    checkpoint_id: str | None
    run: ThreadRun = Field(description="The run that wrote it (queued or running on 202).")


class RecordedAnswer(Approval):
    value: Any = Field(description="The resume value that was recorded (what won).")


class ResumeConflict(BaseModel):
    """409 `decision_conflict`: another answer won the interrupt; `approval` is the wait as it
    was recorded, its `value` the winner's."""

    error: str
    message: str
    approval: RecordedAnswer


# -- rows to models --------------------------------------------------------------------------


def thread_model(row: Row, url: str) -> Thread:
    return Thread(**{name: row[name] for name in Thread.model_fields if name != "url"}, url=url)


def thread_run(row: Row, url: str) -> ThreadRun:
    return ThreadRun(**run_model(row, url).model_dump(), **_place(row))


def waited_run(row: Row, url: str) -> WaitedRun:
    return WaitedRun(**run_model(row, url).model_dump(), **_place(row), output=loads(row["output"]))


def _place(row: Row) -> dict[str, Any]:
    return {
        "thread_id": row.get("thread_id"),
        "thread_seq": row.get("thread_seq"),
        "multitask_strategy": row.get("multitask_strategy"),
    }
