"""Identity: readable job ids, deterministic run ids, canonical hashing, refused ids."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import keel
from keel.core.errors import InvalidId, InvalidInput
from keel.core.ids import (
    MAX_JOB_ID,
    MAX_RUN_ID,
    StepRef,
    args_hash,
    canonical_json,
    digest,
    run_id,
    validate_job_id,
    validate_run_id,
)

# No example database: tests leave the tree clean.
SETTINGS = settings(database=None, max_examples=200, deadline=None)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
valid_job_ids = st.from_regex(r"\A[a-z0-9][a-z0-9._-]{0,40}\Z")


def reorder(value: Any) -> Any:
    """The same value with every mapping's keys inserted in reverse order."""
    if isinstance(value, dict):
        return {k: reorder(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reorder(v) for v in value]
    return value


# -- job ids ---------------------------------------------------------------------------------


def test_job_id_slugs_its_parts_into_a_readable_stable_id() -> None:
    assert keel.job_id("newsletter", dt.date(2026, 8, 7), "AI Signals") == (
        "newsletter-2026-08-07-ai-signals"
    )
    assert keel.job_id("Ticket", 4711, "  Reply!! ") == "ticket-4711-reply"
    assert keel.job_id("a", "", "b") == "a-b"  # an empty part leaves no double dash


@SETTINGS
@given(st.lists(st.text(max_size=30) | st.integers() | st.dates(), min_size=1, max_size=4))
def test_job_id_is_always_valid_or_refused_never_unsafe(parts: list[Any]) -> None:
    try:
        value = keel.job_id(*parts)
    except InvalidId:
        return
    assert validate_job_id(value) == value
    assert keel.job_id(value) == value  # slugging a slug changes nothing


def test_job_id_that_slugs_to_nothing_is_refused_with_a_clear_message() -> None:
    with pytest.raises(InvalidId, match="job_id must be a non-empty string"):
        keel.job_id("!!!", "   ")


def test_job_id_too_long_is_refused_not_silently_truncated() -> None:
    with pytest.raises(InvalidId, match=f"the limit is {MAX_JOB_ID}"):
        keel.job_id("x" * (MAX_JOB_ID + 1))


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "non-empty"),
        ("x" * (MAX_JOB_ID + 1), f"limit is {MAX_JOB_ID}"),
        ("Ticket-1", "lowercase"),
        ("a/b", "lowercase"),
        ("..", "start with a letter or digit"),
        ("../etc", "start with a letter or digit"),
        ("a b", "lowercase"),
        ("héllo", "lowercase"),
        ("-leading-dash", "start with a letter or digit"),
        ("ticket\n", "lowercase"),
        ("ticket\x00", "lowercase"),
    ],
)
def test_invalid_job_id_is_refused_with_a_message_naming_the_rule(
    value: str, fragment: str
) -> None:
    with pytest.raises(InvalidId, match=re.escape(fragment)) as info:
        validate_job_id(value)
    assert "job_id" in str(info.value)


@pytest.mark.parametrize("value", ["", "x" * (MAX_RUN_ID + 1), "RUN", "a/../b", " r", "r\n"])
def test_invalid_run_id_is_refused(value: str) -> None:
    with pytest.raises(InvalidId, match="run_id"):
        validate_run_id(value)


def test_non_string_id_is_refused() -> None:
    with pytest.raises(InvalidId, match="non-empty string"):
        validate_run_id(42)  # type: ignore[arg-type]


# -- run ids ---------------------------------------------------------------------------------


def test_run_id_is_job_id_plus_16_hex_and_deterministic() -> None:
    first = run_id("ticket-4711", "support", "1", canonical_json({"n": 1}))
    assert re.fullmatch(r"ticket-4711-[0-9a-f]{16}", first)
    assert run_id("ticket-4711", "support", "1", canonical_json({"n": 1})) == first


def test_rerun_run_id_adds_attempt_suffix_to_the_same_base() -> None:
    base = run_id("job", "wf", "1", "{}")
    assert run_id("job", "wf", "1", "{}", attempt=2) == f"{base}-a2"
    assert run_id("job", "wf", "1", "{}", attempt=3) == f"{base}-a3"
    with pytest.raises(InvalidId, match="attempt"):
        run_id("job", "wf", "1", "{}", attempt=0)


def test_run_id_changes_with_input_version_workflow_and_job() -> None:
    base = run_id("job", "wf", "1", canonical_json({"n": 1}))
    variants = {
        run_id("job", "wf", "1", canonical_json({"n": 2})),
        run_id("job", "wf", "2", canonical_json({"n": 1})),
        run_id("job", "other", "1", canonical_json({"n": 1})),
        run_id("job2", "wf", "1", canonical_json({"n": 1})),
    }
    assert base not in variants
    assert len(variants) == 4


@SETTINGS
@given(job=valid_job_ids, value=json_values, attempt=st.integers(min_value=1, max_value=999))
def test_every_run_id_is_a_valid_run_id(job: str, value: Any, attempt: int) -> None:
    rid = run_id(job, "wf", "1", canonical_json(value), attempt)
    assert validate_run_id(rid) == rid
    assert rid.startswith(f"{job}-")


def test_run_id_refuses_an_invalid_job_id() -> None:
    with pytest.raises(InvalidId):
        run_id("Bad Job", "wf", "1", "{}")


# -- canonical JSON and hashing --------------------------------------------------------------


@SETTINGS
@given(json_values)
def test_canonical_json_does_not_depend_on_key_order(value: Any) -> None:
    assert canonical_json(reorder(value)) == canonical_json(value)
    assert args_hash([value], {"v": value}) == args_hash([reorder(value)], {"v": reorder(value)})


@SETTINGS
@given(st.dictionaries(st.text(max_size=8), json_scalars, min_size=2, max_size=6))
def test_args_hash_does_not_depend_on_keyword_order(kwargs: dict[str, Any]) -> None:
    assert args_hash((), kwargs) == args_hash((), dict(reversed(list(kwargs.items()))))


@SETTINGS
@given(json_values, json_values)
def test_different_values_hash_differently(a: Any, b: Any) -> None:
    if canonical_json(a) != canonical_json(b):
        assert args_hash([a], {}) != args_hash([b], {})


def test_canonical_json_is_compact_sorted_and_keeps_unicode() -> None:
    assert canonical_json({"b": 1, "a": [1, "é"]}) == '{"a":[1,"é"],"b":1}'


@SETTINGS
@given(
    st.lists(st.text(max_size=6), min_size=1, max_size=4),
    st.lists(st.text(max_size=6), min_size=1, max_size=4),
)
def test_digest_parts_cannot_be_shifted_into_each_other(a: list[str], b: list[str]) -> None:
    # ("ab", "c") and ("a", "bc") are different calls: length-prefixing keeps them apart.
    assert (digest(*a) == digest(*b)) == (a == b)


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), {"x": -math.inf}, {object()}, object(), b"bytes"]
)
def test_non_json_values_raise_invalid_input(value: Any) -> None:
    with pytest.raises(InvalidInput, match="not canonical JSON"):
        canonical_json(value)


def test_mixed_key_types_raise_invalid_input_not_type_error() -> None:
    with pytest.raises(InvalidInput):
        canonical_json({1: "a", "b": 2})


def test_sets_and_dates_have_one_canonical_form() -> None:
    assert canonical_json({3, 1, 2}) == canonical_json({2, 3, 1}) == "[1,2,3]"
    assert canonical_json(dt.date(2026, 8, 7)) == '"2026-08-07"'


# -- idempotency keys ------------------------------------------------------------------------


def test_idempotency_key_is_stable_and_depends_on_every_part() -> None:
    ref = StepRef(run_id="r-1", node="send", step=3, path="__pregel_pull/send")
    key = ref.key("effect", "email", "h1")
    assert key == StepRef("r-1", "send", 3, "__pregel_pull/send").key("effect", "email", "h1")
    assert key.startswith("effect:email:")
    others = {
        StepRef("r-2", "send", 3, "__pregel_pull/send").key("effect", "email", "h1"),
        StepRef("r-1", "other", 3, "__pregel_pull/send").key("effect", "email", "h1"),
        StepRef("r-1", "send", 4, "__pregel_pull/send").key("effect", "email", "h1"),
        StepRef("r-1", "send", 3, "__pregel_push/0").key("effect", "email", "h1"),
        StepRef("r-1", "send", 3, "__pregel_pull/send", "sub").key("effect", "email", "h1"),
        ref.key("effect", "sms", "h1"),
        ref.key("effect", "email", "h2"),
    }
    assert key not in others
    assert len(others) == 7
