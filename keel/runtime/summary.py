"""What a run did, in one picture: its outcome and why, per-node timing, its attempts.

The one place a run's summary is computed (the console shows it; the CLI and the HTTP API can
reuse it). It reads only what `Runtime.get_run` returns, so it is a pure function of the run's
rows and the clock: the timeline is the source, nothing is guessed.

Per-node timing comes from the timeline: a task's `step` event is written with its writes, when
the task ends, so a bar runs from the previous recorded moment of the same attempt (its claim,
or the previous task's write) to the task's own write. Tasks of one superstep run in parallel
but are drawn one after the other, each from the previous write: the bar's end is exact, its
start is an upper bound.

Where the time went (queued, running, waiting for a person, lost to crashes) and where the story
turned (crashes, takeovers, resumes) come from keel.runtime.story.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from keel.core.codec import loads
from keel.runtime.story import Mark, NodeTime, story

# Nodes LangGraph adds around the user's graph: their writes are not the user's steps.
_INTERNAL = frozenset({"__start__", "__end__"})


class Details(Protocol):
    """What the summary reads: `Runtime.get_run`'s `RunDetails` (rows as dicts)."""

    @property
    def run(self) -> dict[str, Any]: ...

    @property
    def timeline(self) -> list[dict[str, Any]]: ...

    @property
    def effects(self) -> list[dict[str, Any]]: ...

    @property
    def waits(self) -> list[dict[str, Any]]: ...

    @property
    def artifacts(self) -> list[Any]: ...


@dataclass(frozen=True)
class Span:
    """One bar of the run's picture: a task, a wait for a person, or work in progress."""

    label: str
    kind: str  # "step", "waiting", "running" (open: no write yet)
    start: float
    end: float
    worker_id: str | None = None
    lease_token: int | None = None

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class Attempt:
    """One lease on the run: who held it, with which token, how it began and what it did."""

    lease_token: int
    worker_id: str | None
    started_at: float
    how: str  # "claimed" or "takeover"
    ended_at: float | None = None
    steps: int = 0
    ended_by: str | None = None  # the event that closed it: status.waiting, lease.takeover, ...
    why: str = ""  # why it began: the first claim, a decision, a crash, a dead worker
    first_node: str | None = None  # where it started (a resume: the node it resumed in)


@dataclass(frozen=True)
class EffectLine:
    name: str
    key: str
    node: str | None
    status: str
    attempts: int
    error: str | None


@dataclass(frozen=True)
class WaitLine:
    name: str
    kind: str
    status: str
    decision: str | None
    decided_by: str | None
    channel: str | None
    comment: str | None
    created_at: float
    decided_at: float | None
    seconds: float  # how long it took to decide (so far, while pending)
    escalation_level: int = 0


@dataclass(frozen=True)
class ArtifactLine:
    name: str
    size: int


@dataclass
class RunSummary:
    run_id: str
    job_id: str
    workflow: str
    version: str
    status: str
    decision: str
    termination_reason: str | None
    outcome: str
    why: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    duration: float | None
    spans: list[Span] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    pending_waits: int = 0
    in_doubt: int = 0
    effects: dict[str, int] = field(default_factory=dict)
    totals: NodeTime = field(default_factory=lambda: NodeTime("(run)"))
    nodes: list[NodeTime] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    effect_lines: list[EffectLine] = field(default_factory=list)
    wait_lines: list[WaitLine] = field(default_factory=list)
    artifacts: list[ArtifactLine] = field(default_factory=list)
    traceparent: str | None = None

    @property
    def trace_id(self) -> str | None:
        parts = (self.traceparent or "").split("-")
        return parts[1] if len(parts) == 4 else None

    intents: dict[str, int] = field(default_factory=dict)
    """The run's outbox intents per state (keel.core.effects.outbox)."""

    @property
    def undelivered(self) -> int:
        """Outbox intents not delivered yet: pending, sending, in doubt or dead."""
        return sum(n for state, n in self.intents.items() if state != "delivered")

    @property
    def takeovers(self) -> int:
        return sum(1 for a in self.attempts if a.how == "takeover")

    @property
    def window(self) -> tuple[float, float]:
        """The time the picture covers (never empty)."""
        start = min([self.created_at, *(s.start for s in self.spans)])
        end = max([start + 0.001, *(s.end for s in self.spans)])
        return start, end


def summarize(details: Details, now: float) -> RunSummary:
    run = details.run
    spans, attempts = _timing(details.timeline, run["status"], now)
    held = sum((now if a.ended_at is None else a.ended_at) - a.started_at for a in attempts)
    totals, nodes, marks = story(details.timeline, run, now, held)
    effects = Counter(str(e["status"]) for e in details.effects)
    pending = [w for w in details.waits if w["status"] == "pending"]
    started, finished = run["started_at"], run["finished_at"]
    intents = Counter(str(i["status"]) for i in getattr(details, "intents", []))
    outcome, why = _explain(details, pending, now)
    undelivered = sum(n for state, n in intents.items() if state != "delivered")
    if undelivered and run["status"] in ("completed", "failed", "cancelled"):
        # Finished steps, unfinished effects: the summary does not claim everything is done.
        states = ", ".join(f"{n} {s}" for s, n in sorted(intents.items()) if s != "delivered")
        outcome = f"{outcome}, {undelivered} outbox effect(s) undelivered"
        why = f"{why}; outbox: {states}"
    failure = getattr(details, "failure", None)
    if failure and failure.get("node"):
        step = f" at step {failure['step']}" if failure.get("step") is not None else ""
        why = f"node {failure['node']} raised{step}: {failure['type']}: {failure['message']}"
    reason = getattr(details, "stranded_reason", None)
    if reason:  # it would look merely queued (or waiting) forever
        outcome, why = f"{outcome}, stranded", f"stranded: {reason}"
    return RunSummary(
        run_id=run["run_id"],
        job_id=run["job_id"],
        workflow=run["workflow"],
        version=run["workflow_version"],
        status=run["status"],
        decision=run["decision"],
        termination_reason=run["termination_reason"],
        outcome=outcome,
        why=why,
        created_at=run["created_at"],
        started_at=started,
        finished_at=finished,
        duration=duration(run, now),
        spans=spans,
        attempts=attempts,
        pending_waits=len(pending),
        in_doubt=effects.get("in_doubt", 0),
        effects=dict(effects),
        totals=totals,
        nodes=nodes,
        marks=marks,
        effect_lines=[
            EffectLine(
                str(e.get("name", "?")),
                str(e.get("idempotency_key", "?")),
                e.get("node"),
                str(e["status"]),
                int(e.get("attempts") or 0),
                e.get("error"),
            )
            for e in details.effects
        ],
        wait_lines=[_wait_line(w, now) for w in details.waits],
        artifacts=[ArtifactLine(a.name, int(a.size)) for a in details.artifacts],
        traceparent=run.get("traceparent"),
        intents=dict(intents),
    )


def duration(run: dict[str, Any], now: float | None) -> float | None:
    """Seconds from the run's first claim to its finish (to `now` while unfinished; None then
    without a `now`, and before the first claim)."""
    started, finished = run.get("started_at"), run.get("finished_at")
    end = finished if finished is not None else now
    return None if started is None or end is None else max(0.0, float(end) - float(started))


def seconds_text(value: float) -> str:
    """12ms, 3.2s, 4m10s, 2h03m, 1d04h: short, and exact enough to compare (the CLI's tables
    and the console's pages)."""
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    if value < 86400:
        return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"
    return f"{int(value // 86400)}d{int(value % 86400 // 3600):02d}h"


def attempts(run: dict[str, Any]) -> int:
    """Executions so far: the first claim, each resume and each takeover (the lease token
    counts them all)."""
    return int(run.get("lease_token") or 0)


def to_dict(summary: RunSummary) -> dict[str, Any]:
    """The summary as JSON-ready data (`GET /v1/runs/{id}/summary`, `keel runs show --json`)."""
    data = asdict(summary)
    data["effect_counts"] = data.pop("effects")
    data["effects"] = data.pop("effect_lines")
    data["waits"] = data.pop("wait_lines")
    data["takeovers"] = summary.takeovers
    data["trace_id"] = summary.trace_id
    for part in (data["totals"], *data["nodes"]):
        part["total"] = part["queued"] + part["running"] + part["waiting"] + part["lost"]
    return data


def _timing(
    timeline: list[dict[str, Any]], status: str, now: float
) -> tuple[list[Span], list[Attempt]]:
    spans: list[Span] = []
    attempts: list[Attempt] = []
    cursor: float | None = None  # the last recorded moment of the current attempt
    waiting_since: float | None = None
    waiting_for = "waiting for a person"  # or "sleeping": the kind of the wait it paused on
    why = "first claim"  # why the next attempt begins, from what came before it
    for event in timeline:
        kind, at = event["kind"], event["at"]
        token, worker = event["lease_token"], event["worker_id"]
        data = event["data"] or {}
        if kind in ("lease.claimed", "lease.takeover"):
            previous = attempts[-1] if attempts else None
            if previous is not None and previous.ended_at is None:
                previous.ended_at, previous.ended_by = at, kind
            if kind == "lease.takeover" and not why.startswith("retry"):
                who = data.get("previous_owner") or (previous.worker_id if previous else None)
                why = f"took over from {who or 'a worker'}: its lease expired (it stopped)"
            how = "takeover" if kind == "lease.takeover" else "claimed"
            attempts.append(Attempt(token or 0, worker, at, how, why=why))
            why = "claimed again"
            cursor = at
        elif kind == "step":
            node = str(data.get("node", "?"))
            if node not in _INTERNAL and cursor is not None:
                label = f"{data['namespace']}/{node}" if data.get("namespace") else node
                spans.append(Span(label, "step", cursor, at, worker, token))
                if attempts:
                    attempts[-1].steps += 1
                    attempts[-1].first_node = attempts[-1].first_node or label
            cursor = at
        elif kind == "decision.recorded":
            by = data.get("by") or "someone"
            why = f"resumed after {data.get('decision', 'a decision')} by {by}"
        elif kind == "attempt.crashed":
            why = f"retry {data.get('attempt', '?')} of {data.get('limit', '?')} after a crash"
        elif kind == "attempt.interrupted":
            why = "resumed after an infrastructure fault"
        elif kind == "wait.registered":
            waiting_for = "sleeping" if data.get("kind") == "timer" else "waiting for a person"
        elif kind == "status.waiting":
            waiting_since = at
            _close(attempts, at, kind)
            cursor = None
        elif kind.startswith("status."):
            if kind == "status.queued" and data.get("from") == "failed":
                why = f"resumed by {data.get('by') or 'someone'} after it failed"
            elif kind == "status.queued" and data.get("reason") == "worker stopping":
                why = "given back by its stopping worker"
            if waiting_since is not None:
                spans.append(Span(waiting_for, "waiting", waiting_since, at))
                waiting_since = None
            if kind != "status.running":
                _close(attempts, at, kind)
                cursor = None
    if waiting_since is not None:
        spans.append(Span(waiting_for, "waiting", waiting_since, now))
    if status == "running" and cursor is not None and attempts:
        current = attempts[-1]
        spans.append(
            Span("in progress", "running", cursor, now, current.worker_id, current.lease_token)
        )
    return spans, attempts


def _wait_line(wait: dict[str, Any], now: float) -> WaitLine:
    created = float(wait.get("created_at") or now)
    decided = wait.get("decided_at")
    who = wait.get("decided_by")
    value = loads(wait.get("value")) if wait.get("value") else None
    principal = value.get("principal") if isinstance(value, dict) else None
    if who and principal and principal != who:
        who = f"{who} ({principal})"
    return WaitLine(
        name=str(wait["name"]),
        kind=str(wait["kind"]),
        status=str(wait["status"]),
        decision=wait.get("decision"),
        decided_by=who,
        channel=wait.get("channel"),
        comment=wait.get("comment"),
        created_at=created,
        decided_at=decided,
        seconds=max(0.0, (float(decided) if decided is not None else now) - created),
        escalation_level=int(wait.get("escalation_level") or 0),
    )


def _close(attempts: list[Attempt], at: float, by: str) -> None:
    if attempts and attempts[-1].ended_at is None:
        attempts[-1].ended_at, attempts[-1].ended_by = at, by


def _explain(details: Details, pending: list[dict[str, Any]], now: float) -> tuple[str, str]:
    """A headline and the sentence that says why, from the recorded facts only."""
    run = details.run
    status = run["status"]
    decided = [w for w in details.waits if w["status"] in ("decided", "expired")]
    last = decided[-1] if decided else None
    if status == "completed":
        reason = run["termination_reason"] or "completed"
        if last is not None and last["kind"] == "approval":
            return f"completed ({reason})", _decision_sentence(last)
        return f"completed ({reason})", "every step ran to the end"
    if status == "failed":
        error = (run["error"] or "no error recorded").strip().splitlines()
        return f"failed ({run['termination_reason'] or 'execution_error'})", error[-1][:300]
    if status == "cancelled":
        by = next(
            (
                (e["data"] or {}).get("by")
                for e in reversed(details.timeline)
                if e["kind"] == "cancel.requested"
            ),
            None,
        )
        return "cancelled", f"cancelled by {by}" if by else "cancelled"
    if status == "waiting" and pending:
        wait = pending[0]
        if wait["kind"] == "outbox":
            payload = loads(wait["payload"]) or {}
            return (
                f"waiting for {wait['name']} to be delivered",
                f"outbox intent {payload.get('intent_id')} is not delivered yet",
            )
        if wait["kind"] == "timer":
            return "sleeping", (
                f"keel.sleep(): wakes at {_utc(wait['deadline'])} by the database's clock; "
                "no worker is held meanwhile"
            )
        if wait["kind"] == "effect":
            payload = loads(wait["payload"]) or {}
            name = payload.get("effect") or payload.get("name") or wait["name"]
            return (
                "waiting: an effect is in doubt",
                f"{name} may or may not have reached the provider; a person must say which",
            )
        level = wait.get("escalation_level") or 0
        escalated = f", escalated to level {level}" if level else ""
        article = "an" if str(wait["kind"])[:1] in "aeiou" else "a"
        return f"waiting for {wait['name']}", f"{article} {wait['kind']} is pending{escalated}"
    if status == "running":
        owner = run["lease_owner"] or "a worker"
        held = f"held by {owner} with lease token {run['lease_token']}"
        holding = _awaiting_deadline(details.timeline)
        if holding is not None:
            return (
                f"waiting for effect {holding.get('effect')}'s deadline",
                f"{held}; its last call may still be under way, so it is reconciled only "
                f"after its deadline ({holding.get('seconds')} s from the event)",
            )
        return "running", held
    if status == "queued":
        if last is not None and run["decision"] != "not_decided":
            return "queued", _decision_sentence(last) + "; a worker will resume it"
        if run.get("not_before") is not None and float(run["not_before"]) > now:
            when = _utc(run["not_before"])
            return "queued, delayed", f"admitted; no worker takes it before {when}"
        return "queued", "admitted; waiting for a worker to claim it"
    return status, ""


def _utc(at: Any) -> str:
    """An epoch time as people read it (UTC, to the second)."""
    return datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _awaiting_deadline(timeline: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The data of an `effect.awaiting_deadline` the run has not gone past (no effect event,
    step or claim since): what its owner is waiting for right now."""
    for event in reversed(timeline):
        kind = str(event["kind"])
        if kind == "effect.awaiting_deadline":
            data = event.get("data")
            return data if isinstance(data, dict) else {}
        if kind.startswith(("effect.", "step", "lease.", "status.")):
            return None
    return None


def _decision_sentence(wait: dict[str, Any]) -> str:
    if wait["status"] == "expired":
        return f"{wait['name']} did not answer in time: {wait['decision']} by the deadline policy"
    value = loads(wait.get("value")) or {}
    who = wait["decided_by"] or "someone"
    principal = value.get("principal") if isinstance(value, dict) else None
    if principal and principal != who:
        who = f"{who} ({principal})"
    via = f" via {wait['channel']}" if wait["channel"] else ""
    comment = f": “{wait['comment']}”" if wait["comment"] else ""
    return f"{wait['decision']} by {who}{via}{comment}"
