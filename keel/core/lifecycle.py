"""Run lifecycle: status, decision and termination reason are separate; one transition table."""

from __future__ import annotations

from enum import StrEnum

from keel.core.errors import InvalidTransition


class Status(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED


class Decision(StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"
    NOT_DECIDED = "not_decided"


class TerminationReason(StrEnum):
    COMPLETED = "completed"
    APPROVED = "approved"
    REJECTED = "rejected"
    MAX_REVISIONS_EXCEEDED = "max_revisions_exceeded"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXECUTION_ERROR = "execution_error"


FINISHED = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})

# from -> allowed targets. running -> running is a takeover (a new lease on the same run);
# running -> queued is a lease given back (graceful shutdown, an infrastructure fault) or a
# decision that arrived; failed -> queued is an operator's resume (same run, same ledger).
# A cancelled run stays cancelled: someone decided it must not go on.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED}),
    Status.RUNNING: frozenset(
        {
            Status.RUNNING,
            Status.QUEUED,
            Status.WAITING,
            Status.COMPLETED,
            Status.FAILED,
            Status.CANCELLED,
        }
    ),
    Status.WAITING: frozenset({Status.QUEUED, Status.CANCELLED, Status.FAILED}),
    Status.COMPLETED: frozenset(),
    Status.FAILED: frozenset({Status.QUEUED}),
    Status.CANCELLED: frozenset(),
}


def check_transition(current: str, target: str) -> Status:
    """Return the target status, or raise InvalidTransition with both ends named."""
    src, dst = Status(current), Status(target)
    if dst not in TRANSITIONS[src]:
        raise InvalidTransition(f"a run cannot go from {src.value} to {dst.value}")
    return dst
