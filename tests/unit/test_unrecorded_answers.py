"""Answers heard but not recorded are kept per (key, lease token), taken once, and bounded."""

from __future__ import annotations

from keel.core.answers import Heard, UnrecordedAnswers


def test_an_answer_is_taken_once_and_only_for_the_token_its_call_was_made_under() -> None:
    answers = UnrecordedAnswers()
    answers.keep("effect:a", 3, Heard(1, {"id": "m-1"}))
    assert answers.take("effect:a", 4) is None  # a later call was made: not its answer
    assert answers.take("effect:a", None) is None  # a row that names no token
    assert answers.take("effect:a", 3) == Heard(1, {"id": "m-1"})
    assert answers.take("effect:a", 3) is None
    assert len(answers) == 0


def test_past_the_limit_the_oldest_answers_go() -> None:
    answers = UnrecordedAnswers(limit=2)
    for n in range(3):
        answers.keep(f"effect:{n}", 1, Heard(1, n))
    assert len(answers) == 2
    assert answers.take("effect:0", 1) is None
    assert [answers.take(f"effect:{n}", 1) for n in (1, 2)] == [Heard(1, 1), Heard(1, 2)]
