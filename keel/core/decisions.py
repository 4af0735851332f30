"""Decisions: a person's (or a channel's) answer to a run's wait, recorded once.

A decision is one call to the store (`Store.decide`): which wait it targets, whether the wait
takes that answer (`check_answer`), the first decision winning by a conditional UPDATE, and the
run queued to resume, all together. A later decision (a double click, a webhook retry, a second
approver) changes nothing and is told what was recorded.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from keel.core.codec import check_storable, dumps
from keel.core.errors import (
    NoPendingWait,
    RunFinished,
    RunNotFound,
    UsageError,
    WaitNotFound,
    WrongWaitKind,
)
from keel.core.faults import fault_point
from keel.core.ids import validate_run_id
from keel.core.lifecycle import FINISHED, Status
from keel.core.services import Services
from keel.core.store.base import Later, Row, Tx
from keel.core.wait_model import RESUMED, EffectAnswer, WaitKind, WaitStatus


def check_answer(wait_kind: str, decision: str, *, wait_id: str) -> None:
    """Raise WrongWaitKind unless `decision` is an answer a wait of `wait_kind` takes.

    A timer takes none (it wakes at its time), nor does an outbox wait (its delivery ends it).
    An in-doubt effect takes only performed/not_performed, every other wait anything else:
    approving an in-doubt effect would resume it without `performed`, that is a second send.
    """
    if wait_kind == WaitKind.TIMER:
        raise WrongWaitKind(
            f"wait {wait_id} is a timer (keel.sleep()): nobody answers it, the run wakes at its "
            "time by the database's clock (cancel the run to stop it)",
            wait_id=wait_id,
            wait_kind=wait_kind,
        )
    if wait_kind == WaitKind.OUTBOX:
        raise WrongWaitKind(
            f"wait {wait_id} waits for an outbox intent's delivery: it ends when the intent is "
            "delivered (see `keel effects list`, `keel effects retry/resolve`)",
            wait_id=wait_id,
            wait_kind=wait_kind,
        )
    if decision == RESUMED and wait_kind != WaitKind.INTERRUPT:
        how = "resolve_effect()" if wait_kind == WaitKind.EFFECT else "approve() or reject()"
        raise WrongWaitKind(
            f"wait {wait_id} is a {wait_kind} wait, not a plain interrupt: answer it with {how}",
            wait_id=wait_id,
            wait_kind=wait_kind,
            with_value=True,
        )
    if (wait_kind == WaitKind.EFFECT) != is_effect_answer(decision):
        how = "resolve_effect()" if wait_kind == WaitKind.EFFECT else "approve() or reject()"
        raise WrongWaitKind(
            f"wait {wait_id} is a {wait_kind} wait: answer it with {how}",
            wait_id=wait_id,
            wait_kind=wait_kind,
        )


@dataclass(frozen=True)
class DecisionResult:
    """What a decision call got: the wait as recorded, and whether this call recorded it."""

    wait: Row
    recorded: bool
    """True for the one call whose decision was recorded; False for every later duplicate."""
    finished: bool = False
    """The run had finished when this call came (a duplicate, told what was recorded: the
    HTTP API answers it 409 `run_finished`, as documented, unless it retries the winner)."""

    @property
    def decision(self) -> str:
        return str(self.wait["decision"])


class Answer(TypedDict, total=False):
    """Who answers a wait, and how: what every decision (approve, reject, resolve) takes."""

    by: str | None
    """Who the caller says decided."""
    principal: str | None
    """The identity that made the call (a token's fingerprint, a Slack user, a login)."""
    comment: str | None
    action_id: str | None
    """The click's or request's id: a retry with the winning one is not a conflict."""
    wait_id: str | None
    """Which wait, if the run waits on several."""
    channel: str
    """Where the answer came from (api, cli, slack, console)."""


async def decide(
    services: Services,
    run_id: str,
    *,
    decision: str,
    wait_id: str | None = None,
    channel: str = "api",
    value: dict[str, Any] | None = None,
    by: str | None = None,
    principal: str | None = None,
    comment: str | None = None,
    action_id: str | None = None,
    then: Callable[[Tx], Awaitable[Later]] | None = None,
    taken: Callable[[Row | None], Awaitable[None]] | None = None,
) -> DecisionResult:
    """Record a decision on a run's wait; the first one wins, atomically.

    `by` is who the caller says decided; `principal` is the identity that made the call (an
    API token's fingerprint, a Slack user, a login), recorded beside it for the audit.
    `then`, a write, commits with the decision whatever it found (a claim of a worker in this
    process, which may take the run the decision queued); its row goes to `taken` as soon as
    it has committed, before anything here can raise."""
    validate_run_id(run_id)
    check_storable([value, by, comment, principal], "the answer")
    store = services.store
    started = time.monotonic()
    answer = {
        "decision": decision,
        "by": by,
        "comment": comment,
        "channel": channel,
        "principal": principal,
        **(value or {}),
    }
    recorded_data = {
        "decision": decision,
        "by": by,
        "principal": principal,
        "channel": channel,
        "action_id": action_id,
    }
    details = {
        "stage": 0,
        "decision": decision,
        "by": by,
        "principal": principal,
        "channel": channel,
        "comment": comment,
    }
    # Everything in one call: which wait, whether it takes this answer, the first decision
    # winning, what follows it. What the call found explains, below, a decision not recorded.
    found, followed = await store.decide(
        run_id,
        wait_id=wait_id,
        decision=decision,
        effect_answer=is_effect_answer(decision),
        value=dumps(answer),
        decided_by=by,
        action_id=action_id,
        channel=channel,
        comment=comment,
        notifiers=[n.name for n in services.notifiers.values() if "decided" in n.kinds],
        details=dumps(details),
        recorded_data=dumps(recorded_data),
        queued_data=dumps(
            {"from": Status.WAITING.value, "to": Status.QUEUED.value, "decision": decision}
        ),
        then=then,
    )
    took = time.monotonic() - started
    if taken is not None:
        await taken(followed)
    if found is None:
        raise RunNotFound(f"no run {run_id!r}")
    store.log_events(found, took=took)  # as the statement wrote them
    wait = _wait_of(found)
    if found["recorded"]:
        assert wait is not None
        fault_point("decision.after_record")
        services.wake()
        return DecisionResult(wait, recorded=True)
    run_status = Status(found["run_status"])
    if wait is None:
        _no_target(run_id, run_status, found, wait_id)
    assert wait is not None
    check_answer(wait["kind"], decision, wait_id=wait["wait_id"])
    finished = run_status in FINISHED
    if wait["status"] == WaitStatus.DECIDED:
        # A double click, a second approver, a retry of the winning call: told what was
        # recorded, whatever the run did since (a worker often finishes it before the last
        # click comes). A wait its deadline's policy or a cancel ended is refused below, as is
        # a wait still pending on a run that ended otherwise (another wait's policy failed it).
        return DecisionResult(wait, recorded=False, finished=finished)
    if wait["status"] != WaitStatus.PENDING or finished:
        raise RunFinished(
            f"run {run_id} is {run_status.value} and its wait {wait['wait_id']} is "
            f"{wait['status']}: it takes no more decisions"
        )
    # Pending when read, yet not decided: another writer ended it first (the sweeper).
    again = await store.get_wait(wait["wait_id"])
    assert again is not None
    return DecisionResult(again, recorded=False)


def is_effect_answer(decision: str) -> bool:
    """Whether `decision` answers an in-doubt effect (the only answers its wait takes)."""
    return decision in (EffectAnswer.PERFORMED, EffectAnswer.NOT_PERFORMED)


_FOUND = (
    "events",
    "events_before",
    "found_run",
    "run_status",
    "run_job",
    "run_workflow",
    "n_pending",
    "pending_ids",
    "recorded",
    "moved",
    "target_id",
)


def _wait_of(found: Row) -> Row | None:
    """The wait row in what `decide` found (its columns beside the run's and the counts)."""
    if found.get("wait_id") is None:
        return None
    return {k: v for k, v in found.items() if k not in _FOUND}


def _no_target(run_id: str, status: Status, found: Row, wait_id: str | None) -> None:
    """Why `decide` found no wait to decide (the rules of its target, in its query)."""
    if wait_id is not None:
        raise WaitNotFound(f"run {run_id} has no wait {wait_id!r}")
    if int(found["n_pending"]) > 1:
        names = found["pending_ids"]
        raise UsageError(f"run {run_id} waits on several decisions ({names}): name one")
    if status in FINISHED:
        raise RunFinished(f"run {run_id} is {status.value}: it takes no more decisions")
    raise NoPendingWait(f"run {run_id} is {status.value}, not waiting for a decision")
