"""The lifecycle table: every allowed move, forbidden moves refused with both ends named."""

from __future__ import annotations

import itertools

import pytest

from keel.core.errors import InvalidTransition
from keel.core.lifecycle import FINISHED, TRANSITIONS, Status, check_transition

Q, R, W = Status.QUEUED, Status.RUNNING, Status.WAITING
C, F, X = Status.COMPLETED, Status.FAILED, Status.CANCELLED

# The design's table, written out independently of keel.core.lifecycle so a change there shows here.
ALLOWED = {
    (Q, R),  # claimed
    (Q, X),  # cancelled before it started
    (R, R),  # a takeover: a new lease on the same run
    (R, Q),  # lease given back on shutdown, or a decision raced the registration
    (R, W),  # paused on a wait
    (R, C),
    (R, F),
    (R, X),
    (W, Q),  # decided: queued to resume
    (W, X),
    (W, F),  # a wait's deadline policy may fail the run
    (F, Q),  # resumed by an operator: same run, same ledger
}
ALL_PAIRS = set(itertools.product(Status, Status))


@pytest.mark.parametrize(("src", "dst"), sorted(ALLOWED))
def test_allowed_transition_is_accepted(src: Status, dst: Status) -> None:
    assert check_transition(src.value, dst.value) is dst


@pytest.mark.parametrize(("src", "dst"), sorted(ALL_PAIRS - ALLOWED))
def test_forbidden_transition_is_refused_naming_both_ends(src: Status, dst: Status) -> None:
    with pytest.raises(InvalidTransition) as info:
        check_transition(src.value, dst.value)
    assert f"from {src.value} to {dst.value}" in str(info.value)


def test_table_matches_the_design_exactly() -> None:
    table = {(src, dst) for src, targets in TRANSITIONS.items() for dst in targets}
    assert table == ALLOWED
    assert set(TRANSITIONS) == set(Status)


@pytest.mark.parametrize("src", sorted(FINISHED))
def test_finished_run_accepts_no_transition_but_a_failed_runs_resume(src: Status) -> None:
    assert src.finished
    for dst in Status:
        if (src, dst) == (F, Q):
            continue
        with pytest.raises(InvalidTransition):
            check_transition(src, dst)


def test_waiting_run_cannot_skip_the_queue_back_to_running() -> None:
    # A resumed run must be claimed again (a new, fenced lease), never flipped to running.
    with pytest.raises(InvalidTransition, match="from waiting to running"):
        check_transition("waiting", "running")


def test_unfinished_statuses_are_not_finished() -> None:
    assert {s for s in Status if not s.finished} == {Q, R, W}


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError):
        check_transition("paused", "running")
