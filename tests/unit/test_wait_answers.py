"""One rule for which answers a wait takes, shared by every channel (API, CLI, HTTP, Slack)."""

from __future__ import annotations

import pytest

from keel.core.decisions import check_answer
from keel.core.errors import UsageError


@pytest.mark.parametrize(
    ("kind", "decision"),
    [
        ("approval", "approved"),
        ("approval", "rejected"),
        ("interrupt", "approved"),
        ("effect", "performed"),
        ("effect", "not_performed"),
    ],
)
def test_answers_that_fit(kind: str, decision: str) -> None:
    check_answer(kind, decision, wait_id="w-1")


def test_approving_an_in_doubt_effect_is_refused() -> None:
    # It would resume the effect without `performed`: a second send.
    with pytest.raises(UsageError, match=r"^wait w-1 is a effect wait: answer it with "):
        check_answer("effect", "approved", wait_id="w-1")


def test_resolving_an_approval_as_an_effect_is_refused() -> None:
    with pytest.raises(UsageError) as refused:
        check_answer("approval", "performed", wait_id="w-2")
    assert str(refused.value) == "wait w-2 is a approval wait: answer it with approve() or reject()"
