"""Answers heard but not recorded are kept per run and key, under the token of their call;
taken once, only for that token, and bounded in number and age."""

from __future__ import annotations

from keel.core.answers import Heard, UnrecordedAnswers


def test_an_answer_is_taken_once_and_only_for_the_run_and_token_of_its_call() -> None:
    answers = UnrecordedAnswers()
    answers.keep("run-1", "effect:a", Heard(3, 1, {"id": "m-1"}))
    assert answers.take("run-2", "effect:a", 3) is None  # another run's key
    heard = answers.take("run-1", "effect:a", 3)
    assert heard is not None and (heard.token, heard.attempts, heard.value) == (3, 1, {"id": "m-1"})
    assert answers.take("run-1", "effect:a", 3) is None
    assert len(answers) == 0


def test_an_answer_under_another_token_is_an_earlier_calls_and_is_forgotten() -> None:
    answers = UnrecordedAnswers()
    answers.keep("run-1", "effect:a", Heard(3, 1, "first"))
    assert answers.take("run-1", "effect:a", 4) is None  # a later call was made
    assert answers.take("run-1", "effect:a", 3) is None  # and the earlier answer is gone
    answers.keep("run-1", "effect:b", Heard(3, 1, "kept"))
    assert answers.take("run-1", "effect:b", None) is None  # a row that names no token
    assert len(answers) == 0


def test_past_the_limit_the_oldest_answers_go() -> None:
    answers = UnrecordedAnswers(limit=2)
    for n in range(3):
        answers.keep("run-1", f"effect:{n}", Heard(1, 1, n))
    assert len(answers) == 2
    assert answers.take("run-1", "effect:0", 1) is None
    taken = [answers.take("run-1", f"effect:{n}", 1) for n in (1, 2)]
    assert [heard.value if heard else None for heard in taken] == [1, 2]


def test_an_answer_older_than_its_age_limit_is_not_used() -> None:
    answers = UnrecordedAnswers(max_age=60.0)
    answers.keep("run-1", "effect:old", Heard(1, 1, "old", at=0.0))
    assert answers.take("run-1", "effect:old", 1) is None
    answers.keep("run-1", "effect:a", Heard(1, 1, "old", at=0.0))
    answers.keep("run-1", "effect:b", Heard(1, 1, "new"))  # keeping sheds the stale ones
    assert len(answers) == 1
