"""The HTTP service's request and response bodies, and how Keel's rows become them.

Rows store JSON columns as text; the API returns them parsed. Fields a client should not rely
on (lease owners, internal hashes) stay in the timeline, not in these models.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from keel.core.codec import loads
from keel.core.lifecycle import Status
from keel.core.store.base import Row
from keel.runtime import summary

M = TypeVar("M", bound=BaseModel)


class Body(BaseModel):
    # A misspelled field is an error, not silently ignored.
    model_config = ConfigDict(extra="forbid")


class SubmitIn(Body):
    workflow: str = Field(min_length=1, max_length=200, description="A registered workflow name.")
    job_id: str = Field(min_length=1, description="Readable, stable id of the job.")
    input: Any = Field(description="The run's input (any JSON value; a dict for most graphs).")
    version: str | None = Field(None, description="Workflow version; the latest when omitted.")
    rerun: bool = Field(False, description="Admit a new attempt even if this job already ran.")
    if_exists: Literal["new", "reuse", "error"] = Field(
        "reuse",
        description="When the job already has a run with other input: give back the job's "
        "latest run (the default: a job id is an idempotency key), admit a new run, or refuse "
        "(409 job_exists).",
    )
    after: float | str | None = Field(
        None,
        description='Delay the run: seconds, or a duration such as "90s", "5m", "2h". '
        "It is admitted now and claimed once the database's clock reaches that time.",
    )
    not_before: AwareDatetime | None = Field(
        None, description="Delay the run until this instant (with its timezone); not with after."
    )
    webhook: str | None = Field(
        None,
        max_length=2000,
        description="A URL told, signed, when the run ends (docs/webhooks.md); 422 "
        "webhook_refused for a private address not allowed or without a signing secret.",
    )
    webhook_on: list[Literal["completed", "failed", "cancelled", "timed_out", "interrupted"]] = (
        Field(
            ["completed", "failed", "cancelled", "timed_out"],
            min_length=1,
            description="What the webhook is sent for; `interrupted`: each pause on a wait.",
        )
    )


class CancelIn(Body):
    by: str | None = Field(None, max_length=200, description="Who cancels (for the timeline).")


class ResolutionIn(Body):
    performed: bool = Field(description="Whether the in-doubt effect reached the provider.")
    result: Any = Field(None, description="The provider's result, when it was performed.")
    comment: str | None = Field(None, max_length=10_000)
    by: str | None = Field(None, max_length=200, description="Who answers; defaults to the token.")
    action_id: str | None = Field(None, min_length=1, max_length=200)


class ResumeIn(Body):
    by: str | None = Field(None, max_length=200, description="Who resumes (for the timeline).")


class UpgradeIn(Body):
    to: str = Field(min_length=1, max_length=200, description="The version to move the run to.")
    by: str | None = Field(None, max_length=200, description="Who upgrades (for the timeline).")


class DecisionIn(Body):
    decision: Literal["approve", "reject"]
    comment: str | None = Field(None, max_length=10_000)
    by: str | None = Field(None, max_length=200, description="Who decides; defaults to the token.")
    action_id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="Deduplication key; the Idempotency-Key header takes precedence.",
    )


class Run(BaseModel):
    run_id: str
    job_id: str
    workflow: str
    workflow_version: str
    attempt: int
    status: str
    decision: str
    termination_reason: str | None
    error: str | None
    cancel_requested: bool
    stranded: bool = Field(
        description="The run needs a worker of a version that no worker serves (see "
        "docs/versions.md); move it with POST /v1/runs/{id}/upgrade."
    )
    stranded_reason: str | None = Field(
        None,
        description="Why it is stranded, in one line: no live worker serves its version, or "
        "workers refuse it because their graph differs from the version's.",
    )
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    not_before: float | None = Field(
        None, description="A delayed run: no worker claims it before this time (epoch seconds)."
    )
    duration: float | None = Field(
        None,
        description="Seconds from the first claim to the finish (to now while unfinished); "
        "null before the first claim.",
    )
    attempts: int = Field(
        0,
        description="Executions so far: the first claim, each resume after a wait and each "
        "takeover (`attempt` is which rerun of the job this run is).",
    )
    url: str


class Submitted(Run):
    other_runs: list[str] = Field(
        description="The job's runs of this workflow with other input, newest first."
    )


class RunPage(BaseModel):
    runs: list[Run]
    limit: int
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null on the last one.")


class Event(BaseModel):
    event_id: int
    at: float
    kind: str
    worker_id: str | None
    lease_token: int | None
    data: Any


class Effect(BaseModel):
    idempotency_key: str
    name: str
    node: str
    step: int
    status: str
    attempts: int
    result: Any
    error: str | None
    created_at: float
    updated_at: float


class Approval(BaseModel):
    """A wait: an approval, an in-doubt effect, or a plain interrupt."""

    approval_id: str
    run_id: str
    kind: str
    name: str
    status: str
    payload: Any
    approvers: list[str]
    deadline: float | None
    on_timeout: str
    escalation_level: int
    decision: str | None
    decided_by: str | None
    principal: str | None
    """The identity that made the call (e.g. `token:<fingerprint>`), beside the `by` it gave."""
    channel: str | None
    comment: str | None
    action_id: str | None
    decided_at: float | None
    created_at: float
    run_url: str


class ApprovalPage(BaseModel):
    approvals: list[Approval]
    limit: int
    offset: int
    next_offset: int | None


class DecisionOut(Approval):
    recorded: bool = Field(
        description="True for the request that recorded the decision; false when an earlier one "
        "had (the recorded decision is returned either way)."
    )


class Notification(BaseModel):
    intent_id: str
    wait_id: str | None
    notifier: str
    kind: str
    status: str
    attempts: int
    error: str | None
    created_at: float
    updated_at: float


class Intent(BaseModel):
    """One outbox intent: an effect recorded by a step, delivered by a dispatcher."""

    intent_id: str
    run_id: str
    effect: str
    node: str
    step: int
    status: str = Field(description="pending, sending, delivered, dead or in_doubt.")
    attempts: int
    max_attempts: int
    error: str | None
    args: Any
    result: Any
    created_at: float
    updated_at: float
    delivered_at: float | None


class Artifact(BaseModel):
    name: str
    size: int
    download_url: str


class Failure(BaseModel):
    """Where and how a failed run failed: the evidence a worker's log used to hold alone."""

    type: str
    message: str
    node: str | None = Field(None, description="The node that raised (the root graph's).")
    inner_node: str | None = Field(None, description="The node inside its subgraph, if any.")
    task_path: str | None = None
    step: int | None = None
    traceback: str = Field(description="Bounded; the user's frames first when it is cut.")


class RunDetail(Run):
    input: Any
    output: Any
    failure: Failure | None = Field(
        None, description="Set when the run failed: where, and the traceback."
    )
    timeline: list[Event]
    effects: list[Effect]
    waits: list[Approval]
    notifications: list[Notification]
    intents: list[Intent] = Field(description="Its outbox effects' intents, oldest first.")
    artifacts: list[Artifact]


class Problem(BaseModel):
    """Every error response: a stable code and a sentence for people."""

    error: str
    message: str
    approval: Approval | None = None


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    database: str
    schema_version: int | None = None
    expected_schema_version: int | None = None
    reason: str | None = None


# -- rows to models -------------------------------------------------------------------------


def run_model(row: Row, url: str, now: float | None = None) -> Run:
    return Run(**_run_fields(row, now), url=url)


def _run_fields(row: Row, now: float | None = None) -> dict[str, Any]:
    return {
        "duration": summary.duration(row, now),
        "attempts": summary.attempts(row),
        "run_id": row["run_id"],
        "job_id": row["job_id"],
        "workflow": row["workflow"],
        "workflow_version": row["workflow_version"],
        "attempt": row["attempt"],
        "status": row["status"],
        "decision": row["decision"],
        "termination_reason": row["termination_reason"],
        "error": row["error"],
        "cancel_requested": bool(row["cancel_requested"]),
        "stranded": bool(row.get("stranded", False)),
        "stranded_reason": row.get("stranded_reason"),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "not_before": row.get("not_before"),
    }


def approval_fields(row: Row, run_url: str) -> dict[str, Any]:
    return {
        "approval_id": row["wait_id"],
        "run_id": row["run_id"],
        "kind": row["kind"],
        "name": row["name"],
        "status": row["status"],
        "payload": loads(row["payload"]),
        "approvers": loads(row["approvers"]) or [],
        "deadline": row["deadline"],
        "on_timeout": row["on_timeout"],
        "escalation_level": row.get("escalation_level") or 0,
        "decision": row["decision"],
        "decided_by": row["decided_by"],
        "principal": decision_principal(row),
        "channel": row["channel"],
        "comment": row["comment"],
        "action_id": row["action_id"],
        "decided_at": row["decided_at"],
        "created_at": row["created_at"],
        "run_url": run_url,
    }


def decision_principal(row: Row) -> str | None:
    """Who made the decision's call, kept in its recorded value (older decisions have none)."""
    value = loads(row["value"]) if row.get("value") else None
    return value.get("principal") if isinstance(value, dict) else None


def approval_model(row: Row, run_url: str) -> Approval:
    return Approval(**approval_fields(row, run_url))


def event_model(row: Row) -> Event:
    data = row["data"]
    return _from_row(Event, row, data=loads(data) if isinstance(data, str) else data)


def _from_row(model: type[M], row: Row, **converted: Any) -> M:
    """The model with each field its column as stored, except those `converted` gives."""
    stored = {name: row[name] for name in model.model_fields if name not in converted}
    return model(**stored, **converted)


def effect_model(row: Row) -> Effect:
    return _from_row(Effect, row, result=loads(row["result"]))


def notification_model(row: Row) -> Notification:
    return _from_row(Notification, row)


def intent_model(row: Row) -> Intent:
    return _from_row(Intent, row, args=loads(row["args"]), result=loads(row["result"]))


def run_detail(
    run: Row,
    *,
    url: str,
    run_url: str,
    timeline: list[Row],
    effects: list[Row],
    waits: list[Row],
    notifications: list[Row],
    intents: list[Row],
    artifacts: list[Artifact],
    failure: dict[str, Any] | None = None,
) -> RunDetail:
    return RunDetail(
        **_run_fields(run),
        failure=Failure(**failure) if failure else None,
        url=url,
        input=loads(run["input"]),
        output=loads(run["output"]),
        timeline=[event_model(e) for e in timeline],
        effects=[effect_model(e) for e in effects],
        waits=[approval_model(w, run_url) for w in waits],
        notifications=[notification_model(n) for n in notifications],
        intents=[intent_model(i) for i in intents],
        artifacts=artifacts,
    )


# -- the run summary (keel.runtime.summary.to_dict) --------------------------------------------
# Its effect, wait and artifact lines are keel.runtime.summary's own dataclasses.


class TimeSplit(BaseModel):
    node: str = Field(description="The node (namespace/node inside a subgraph); (run) in total.")
    queued: float = Field(description="Seconds queued for a worker before this node ran.")
    running: float = Field(description="Seconds a worker spent executing it.")
    waiting: float = Field(description="Seconds it waited for a person.")
    lost: float = Field(
        description="Seconds lost between a crash and the takeover that resumed it."
    )
    total: float
    executions: int = Field(description="How many times it ran (re-runs after crashes count).")


class SummaryAttempt(BaseModel):
    lease_token: int
    worker_id: str | None
    started_at: float
    ended_at: float | None
    how: Literal["claimed", "takeover"]
    why: str = Field(description="Why it began: first claim, a decision, a crash, a dead worker.")
    ended_by: str | None = Field(description="The event that closed it (status.waiting, ...).")
    steps: int
    first_node: str | None


class SummaryMark(BaseModel):
    at: float
    kind: Literal["crash", "infrastructure", "takeover", "lease_lost", "resumed", "failed"]
    text: str
    worker_id: str | None
    lease_token: int | None


class SummarySpan(BaseModel):
    label: str
    kind: Literal["step", "waiting", "running"]
    start: float
    end: float
    worker_id: str | None
    lease_token: int | None


class RunSummary(BaseModel):
    """What a person asks first about a run: see docs/http.md, "GET /v1/runs/{id}/summary"."""

    run_id: str
    job_id: str
    workflow: str
    version: str
    status: Status
    decision: str
    termination_reason: str | None
    outcome: str = Field(description="The headline: completed (approved), waiting for manager...")
    why: str = Field(description="The sentence that says why, from the recorded facts only.")
    created_at: float
    started_at: float | None
    finished_at: float | None
    duration: float | None
    totals: TimeSplit
    nodes: list[TimeSplit]
    attempts: list[SummaryAttempt]
    takeovers: int
    marks: list[SummaryMark] = Field(description="Crashes, takeovers and resumes, in order.")
    spans: list[SummarySpan]
    effects: list[summary.EffectLine]
    effect_counts: dict[str, int]
    in_doubt: int
    waits: list[summary.WaitLine]
    pending_waits: int
    artifacts: list[summary.ArtifactLine]
    intents: dict[str, int] = Field(
        default_factory=dict, description="The run's outbox intents per state."
    )
    trace_id: str | None = Field(description="The run's OpenTelemetry trace id, when traced.")
    traceparent: str | None
