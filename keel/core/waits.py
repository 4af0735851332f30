"""Waits: a run paused for a person (approval, in-doubt effect) or a signal.

Inside a node, `approval()` only calls LangGraph's `interrupt()` with a description of the wait:
no I/O, so it behaves the same in sync and async nodes and on every replay. When the graph
pauses, the executor registers each interrupt as a wait row (idempotently; the wait id is
derived from the run id and LangGraph's deterministic interrupt id) with its deadline. Once
answered (keel.core.decisions: the first decision wins), the run resumes with the answers as
LangGraph's resume map.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keel.core import logs
from keel.core.clock import parse_duration
from keel.core.codec import dumps, loads
from keel.core.context import RunContext, current
from keel.core.effects import outbox as effect_outbox
from keel.core.errors import InvalidTransition, UsageError
from keel.core.ids import digest
from keel.core.lifecycle import Decision, Status
from keel.core.store.base import EndWith, Later, Row, Tx
from keel.core.store.store import Store
from keel.core.wait_model import (
    RESUMED,
    WaitKind,
    WaitStatus,
    escalation_targets,
    keel_wait,
    stored_schedule,
)

POLICIES = ("reject", "cancel", "timeout", "escalate", "fail")
DEFAULT_WAIT_TIMEOUT = 7 * 86400.0


@dataclass(frozen=True)
class ApprovalDecision:
    """What `keel.approval()` returns once a person (or the deadline) decided."""

    decision: str
    wait_id: str
    by: str | None = None
    comment: str | None = None
    channel: str | None = None
    at: float | None = None
    principal: str | None = None
    """The identity that made the decision's call (`by` is what it said)."""

    @property
    def approved(self) -> bool:
        return self.decision == Decision.APPROVED

    @classmethod
    def from_value(cls, value: Any) -> ApprovalDecision:
        if not isinstance(value, dict) or "decision" not in value:
            raise UsageError(f"a Keel approval was resumed with {value!r}, not a decision")
        return cls(
            decision=str(value["decision"]),
            wait_id=str(value.get("wait_id", "")),
            by=value.get("by"),
            comment=value.get("comment"),
            channel=value.get("channel"),
            at=value.get("at"),
            principal=value.get("principal"),
        )


def approval(
    name: str,
    *,
    payload: Any = None,
    timeout: float | str = "24h",
    on_timeout: str = "reject",
    approvers: str | Sequence[str] = (),
    remind_after: float | str | None = None,
    escalate_after: float | str | None = None,
    escalate_to: str | Sequence[str] = (),
) -> ApprovalDecision:
    """Pause the run until someone approves or rejects (or the deadline's policy applies).

    `remind_after` and `escalate_after` (durations from when the wait was registered) schedule a
    reminder to `approvers` and an escalation to `escalate_to`, delivered once each through the
    App's notifiers; at `timeout` the `on_timeout` policy applies. `approvers` and `escalate_to`
    are lists of ids (Slack user ids, email addresses); one id may be given as a string. Code
    before this call re-runs when the run resumes: keep side effects in effects.
    """
    ctx = current("keel.approval()")
    spec = wait_spec(
        WaitKind.APPROVAL,
        name,
        payload,
        timeout=timeout,
        on_timeout=on_timeout,
        approvers=approvers,
        remind_after=remind_after,
        escalate_after=escalate_after,
        escalate_to=escalate_to,
    )
    return ApprovalDecision.from_value(ctx.pause({"keel_wait": spec}))


def interrupt(
    value: Any,
    *,
    name: str = "interrupt",
    timeout: float | str = DEFAULT_WAIT_TIMEOUT,
    on_timeout: str = "fail",
    approvers: str | Sequence[str] = (),
    remind_after: float | str | None = None,
    escalate_after: float | str | None = None,
    escalate_to: str | Sequence[str] = (),
) -> Any:
    """LangGraph's `interrupt(value)` with a deadline and escalation: pause the run until
    someone resumes it with any JSON value (`App.resume(thread_id, value)`), which this
    returns. A plain `langgraph.types.interrupt()` waits the same way, with a 7-day deadline
    that fails the run. At `timeout` the `on_timeout` policy applies: "fail" or "cancel" end
    the run; "timeout", "reject" and "escalate" resume it with the recorded decision (a dict
    with "decision"). Code before this call re-runs when the run resumes."""
    ctx = current("keel.interrupt()")
    spec = wait_spec(
        WaitKind.INTERRUPT,
        name,
        value,
        timeout=timeout,
        on_timeout=on_timeout,
        approvers=approvers,
        remind_after=remind_after,
        escalate_after=escalate_after,
        escalate_to=escalate_to,
    )
    return ctx.pause({"keel_wait": spec})


def wait_spec(
    kind: WaitKind,
    name: str,
    payload: Any,
    *,
    timeout: float | str,
    on_timeout: str,
    approvers: str | Sequence[str],
    remind_after: float | str | None,
    escalate_after: float | str | None,
    escalate_to: str | Sequence[str],
) -> dict[str, Any]:
    """The description of a wait a node pauses on (it goes into the checkpoint, read back by
    any later version: plain strings), with its reminder and escalation stages in order."""
    if on_timeout not in POLICIES:
        raise UsageError(f"on_timeout must be one of {', '.join(POLICIES)}, not {on_timeout!r}")
    named, targets = _ids(approvers), _ids(escalate_to)
    schedule: list[dict[str, Any]] = []
    if remind_after is not None:
        schedule.append({"after": parse_duration(remind_after), "kind": "remind"})
    if escalate_after is not None:
        schedule.append(
            {"after": parse_duration(escalate_after), "kind": "escalate", "to": targets}
        )
    schedule.sort(key=lambda stage: stage["after"])
    return {
        "kind": kind.value,
        "name": name,
        "payload": payload,
        "timeout": parse_duration(timeout),
        "on_timeout": on_timeout,
        "approvers": named,
        "schedule": schedule,
        # Apart from the stages: the deadline's `escalate` policy escalates to them too, and
        # they may decide, with or without an `escalate_after` stage.
        "escalate_to": targets,
    }


def _ids(given: str | Sequence[str]) -> list[str]:
    """The ids a wait names: a list of them, or one given as a plain string (not its
    characters: `approvers="U0EDITOR"` is one approver)."""
    if isinstance(given, str):
        return [given] if given else []
    return list(given)


def wait_id_for(run_id: str, interrupt_id: str) -> str:
    return "w-" + digest(run_id, interrupt_id)[:24]


def _spec(value: Any) -> dict[str, Any]:
    if (spec := keel_wait(value)) is not None:
        return dict(spec)
    # A plain interrupt() from user code: a generic wait, decided with approve/reject/decide.
    return {
        "kind": WaitKind.INTERRUPT.value,
        "name": "interrupt",
        "payload": value,
        "timeout": DEFAULT_WAIT_TIMEOUT,
        "on_timeout": "fail",
    }


async def register(
    ctx: RunContext, interrupts: Sequence[Any], *, within: EndWith | None = None
) -> Status:
    """Record the waits the graph paused on and release the run until a decision arrives: one
    fenced transaction in one call (`Store.step_transaction`): one call on SQLite's database
    thread, one pipeline and round trip on PostgreSQL (an outbox wait, whose intent may have
    been delivered already, reads it: one more). `within`: that transaction is the saver's,
    with the writes of the pause (`Fencing.ending`), fenced there."""
    store = ctx.services.store
    started = time.monotonic()
    specs = [(wait_id_for(ctx.run_id, intr.id), intr, _spec(intr.value)) for intr in interrupts]
    notifiers = [n.name for n in ctx.services.notifiers.values() if "request" in n.kinds]

    registered: list[tuple[dict[str, Any], Later]] = []

    async def record(tx: Tx) -> Later:
        registered.clear()  # a transaction retried (keel.langgraph.savers) records again
        for wid, intr, spec in specs:
            timeout = spec.get("timeout")
            schedule = spec.get("schedule", [])
            # A spec from before `escalate_to` was kept apart names them in its stages only.
            targets = spec.get("escalate_to", escalation_targets(schedule))
            event = {"wait_id": wid, "kind": spec.get("kind"), "name": spec.get("name")}
            row = await store.register_wait(
                tx,
                wait_id=wid,
                run_id=ctx.run_id,
                token=ctx.token,
                worker_id=ctx.worker_id,
                interrupt_id=intr.id,
                kind=spec.get("kind", WaitKind.INTERRUPT),
                name=spec.get("name", "interrupt"),
                payload=dumps(spec.get("payload")),
                approvers=dumps(spec.get("approvers", [])),
                deadline_after=float(timeout) if timeout is not None else None,
                on_timeout=spec.get("on_timeout", "fail"),
                schedule=dumps(stored_schedule(schedule, targets)),
                first_stage_after=float(schedule[0]["after"]) if schedule else None,
                event=dumps(event),
                notifiers=notifiers,
            )
            registered.append((event, row))
            if spec.get("kind") == WaitKind.OUTBOX and await row() is not None:
                # Delivered before this wait existed: answered now, the run goes on at once.
                for intent_id in effect_outbox.awaited(spec["payload"]):
                    intent = await store.read_intent(tx, intent_id)
                    if intent is not None and await effect_outbox.answer_waits(store, tx, intent):
                        break
        # Cancelled while this step ran: this pause is its step boundary, nobody is asked. A
        # decision already in (it raced the registration) resumes the run at once.
        return await store.end_registration(
            tx, ctx.run_id, ctx.token, ctx.worker_id, [wid for wid, _, _ in specs]
        )

    async def body(tx: Tx) -> Later:
        await store.fence_step(tx, ctx.run_id, ctx.token)  # a stale token commits nothing
        return await record(tx)

    if within is None:
        moved = await store.step_transaction(body)
        ended = await moved()
    else:
        ended = await within(record)
    took = time.monotonic() - started
    if ended is None:
        raise InvalidTransition(f"run {ctx.run_id} is not running: it registers no wait")
    for event, row in registered:
        if await row() is not None:
            logs.event(
                ctx.run_id,
                "wait.registered",
                event,
                worker_id=ctx.worker_id,
                token=ctx.token,
                took=took,
            )
    store.log_events(ended, took=took)  # its move, as the statement recorded it
    return Status(ended["target"])


def resume_map(answered: Sequence[Row], pending_interrupt_ids: set[str]) -> dict:
    """Decided waits whose interrupts are still pending, as LangGraph's resume map. `answered`:
    the run's waits, as its claim returned them (`claimed_answers`) or as read."""
    return {
        w["interrupt_id"]: resume_value(loads(w["value"]))
        for w in answered
        if w["status"] != WaitStatus.PENDING and w["interrupt_id"] in pending_interrupt_ids
    }


def resume_value(answer: Any) -> Any:
    """What `interrupt()` returns for a recorded answer: a resume's own value; else the
    decision (an approval's verdict, a deadline's policy) as recorded."""
    if isinstance(answer, dict) and answer.get("decision") == RESUMED and "resume" in answer:
        return answer["resume"]
    return answer


async def claimed_answers(store: Store, run: Row) -> list[Row]:
    """The answered waits of a claimed run: its claim returned them (`decided_waits`, one
    statement with the claim), read here only for a row that did not come from a claim."""
    if "decided_waits" in run:
        return list(loads(run["decided_waits"]) or [])
    return await store.waits(str(run["run_id"]))
