"""Run lifecycle: status, decision and termination reason are separate; one transition table.

The table is the rule; the statements that write `keel_runs.status` (in the store's
queries.sql) are its commands: each declares the moves it makes in a `-- moves:` header, and
tests hold them to the table (tests/unit/test_state_machine.py: every declared move allowed,
every allowed move made by some statement; tests/store/conftest.py: every move a store test
recorded on a timeline allowed).
"""

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
    """A run's verdict, taken from its approval waits (an in-doubt effect's answer is not one)."""

    APPROVED = "approved"
    REJECTED = "rejected"
    """By a person, or by a deadline whose policy is `reject`."""
    NOT_DECIDED = "not_decided"


class TerminationReason(StrEnum):
    """Why a finished run ended, beside its status: a completed run ended by its approval's
    verdict says so, one whose wait ran out says timed_out."""

    COMPLETED = "completed"
    APPROVED = "approved"
    REJECTED = "rejected"
    MAX_REVISIONS_EXCEEDED = "max_revisions_exceeded"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXECUTION_ERROR = "execution_error"
    INTERRUPTED = "interrupted"
    """Cancelled because a later run on its thread was submitted with `interrupt`: it stopped at
    a step boundary and the later run goes on from there."""
    ROLLED_BACK = "rolled_back"
    """Cancelled because a later run on its thread was submitted with `rollback`: its
    checkpoints were discarded (its ledger stays: what it performed is recorded)."""


FINISHED = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
ADMITTED = Status.QUEUED
"""The status a run is admitted with."""
NEW = "new"
"""The `from` of an admission's move (`new>queued` in a query's `-- moves:` header)."""

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


def allowed(src: str, dst: str) -> bool:
    """Whether the table lets a run go from `src` to `dst` (`new`: an admission)."""
    if src == NEW:
        return dst == ADMITTED
    return src in TRANSITIONS and dst in TRANSITIONS[Status(src)]


def check_transition(current: str, target: str) -> Status:
    """Return the target status, or raise InvalidTransition with both ends named."""
    src, dst = Status(current), Status(target)
    if dst not in TRANSITIONS[src]:
        raise InvalidTransition(f"a run cannot go from {src.value} to {dst.value}")
    return dst
